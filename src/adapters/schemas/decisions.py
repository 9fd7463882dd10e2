"""Wire schemas of the decision surfaces (R-API-4): TypeSafe SystemOne requests and answers.

`POST /v1/decisions` and `POST /v1/systemone` take `{model, state, questions, options?}`;
`POST /v1/systemone/batches` takes `{model, states: [{id, state}], questions, options?}`.
Question shapes follow the `typesafe-sdk` wire models (`instructions` and descriptions may be
text, an object or an array; a choice option or noul outcome may be left undescribed).
`set` and `span` questions take upstream's ordered form (`labels: [name | {key, description}]`,
1–255, and `threshold` in [0, 1], default 0.5); their answers add `sets` and `spans`
(surfaces/decision_labels.py). Decoders are built once; unknown fields are refused.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta, Struct

from vllm_srun.adapters.schemas.common import CommonOptions, ResponseMeta, Strict

MAX_QUESTIONS = 1024  # per request; states × questions for a batch
MAX_ROWS = 4096  # per request: noul rows once set and span questions are laid out (states × rows for a batch)
MIN_LABELS, MAX_LABELS = 1, 255  # set and span questions
Content = str | dict[str, Any] | list[Any]


class NoulCriteria(Strict):
    true: Content | None = None
    false: Content | None = None


class NoulQuestion(Strict, tag_field="type", tag="noul"):
    instructions: Content | None = None
    criteria: NoulCriteria | None = None


class ChoiceQuestion(Strict, tag_field="type", tag="choice"):
    criteria: dict[str, Content | None]  # option name → description (None: read by its name)
    instructions: Content | None = None


class ScoreQuestion(Strict, tag_field="type", tag="score"):
    criteria: list[Content]  # ordered level descriptions; level i is answered by the token "i"
    instructions: Content | None = None


class BoxQuestion(Strict, tag_field="type", tag="box"):
    """Accepted so that it fails in place: locating boxes needs an image model."""

    instructions: Content | None = None


LabelName = Annotated[str, Meta(min_length=1, max_length=256)]


class LabelItem(Strict):
    key: LabelName
    description: Content | None = None


Labels = Annotated[list[LabelName | LabelItem], Meta(min_length=MIN_LABELS, max_length=MAX_LABELS)]
Threshold = Annotated[float, Meta(ge=0.0, le=1.0)]


class SetQuestion(Strict, tag_field="type", tag="set"):
    """One noul per label (`answers["id.label"]`) and `sets.id = {selected, probabilities}`."""

    labels: Labels
    instructions: Content | None = None
    threshold: Threshold = 0.5


class SpanQuestion(Strict, tag_field="type", tag="span"):
    """A noul (does the content hold any label?) and `spans.id = [{label, start, end, text, probability}]`."""

    labels: Labels
    instructions: Content | None = None
    threshold: Threshold = 0.5


Question = NoulQuestion | ChoiceQuestion | ScoreQuestion | BoxQuestion | SetQuestion | SpanQuestion
Questions = Annotated[dict[str, Question], Meta(min_length=1)]


class DecisionsOptions(CommonOptions):
    pass


class DecisionsRequest(Strict):
    state: Content
    questions: Questions
    model: str | None = None
    options: DecisionsOptions | None = None
    assets: dict[str, Any] | None = None  # TypeSafe media assets: refused, these models read text only


# an id is echoed in the answer: a string, or a signed 64-bit integer (what every encoder and client holds)
StateId = str | Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]


class BatchState(Strict):
    id: StateId
    state: Content


class DecisionsBatchRequest(Strict):
    states: Annotated[list[BatchState], Meta(min_length=1)]
    questions: Questions
    model: str | None = None
    options: DecisionsOptions | None = None


class QuestionErrorBody(Struct):
    code: str
    message: str


class DecisionAnswer(Struct, omit_defaults=True):
    """One question's answer; the fields present depend on `type` (or `error` when it failed)."""

    type: str
    noul: float | None = None  # noul: P(yes)
    choice: str | None = None  # choice: the most probable option
    score: float | None = None  # score: the expected level, Σ level × P(level)
    confidence: float | None = None  # choice/score: the probability of the most probable answer
    legend: dict[str, Any] | None = None  # score: level → its criteria entry
    probabilities: dict[str, float] | None = None  # choice: option → P; score: level → P
    error: QuestionErrorBody | None = None


class SetResult(Struct):
    selected: list[str]  # the labels with P(yes) >= threshold, in the question's order
    probabilities: dict[str, float]  # label → P(yes)


class SpanItem(Struct):
    label: str
    start: int  # code points of the state's text, end exclusive
    end: int
    text: str
    probability: float  # the mean P(yes) of the span's words


class DecisionsUsage(Struct):
    input_tokens: int  # the state once plus every answered question
    output_tokens: int = 0


class DecisionsResponse(Struct, omit_defaults=True):
    model: str
    answers: dict[str, DecisionAnswer]
    usage: DecisionsUsage
    meta: ResponseMeta | None = None
    sets: dict[str, SetResult] | None = None  # set questions
    spans: dict[str, list[SpanItem]] | None = None  # span questions


class BatchResult(Struct, omit_defaults=True):
    id: StateId
    answers: dict[str, DecisionAnswer]
    usage: DecisionsUsage
    sets: dict[str, SetResult] | None = None
    spans: dict[str, list[SpanItem]] | None = None


class DecisionsBatchResponse(Struct, omit_defaults=True):
    model: str
    results: list[BatchResult]
    usage: DecisionsUsage
    meta: ResponseMeta | None = None


decisions_decoder = msgspec.json.Decoder(DecisionsRequest)
batch_decoder = msgspec.json.Decoder(DecisionsBatchRequest)
