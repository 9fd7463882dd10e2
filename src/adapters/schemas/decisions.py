"""Wire schemas of the decision surfaces (R-API-4): TypeSafe SystemOne requests and answers.

`POST /v1/decisions` and `POST /v1/systemone` take `{model, state, questions, options?}`;
`POST /v1/systemone/batches` takes `{model, states: [{id, state}], questions, options?}`.
Question shapes follow the `typesafe-sdk` wire models (`instructions` and descriptions may be
text, an object or an array; a choice option or noul outcome may be left undescribed).
Decoders are built once; unknown fields are refused.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta, Struct

from vllm_srun.adapters.schemas.common import CommonOptions, ResponseMeta, Strict

MAX_QUESTIONS = 1024  # per request; states × questions for a batch
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


Question = NoulQuestion | ChoiceQuestion | ScoreQuestion | BoxQuestion
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


class DecisionsUsage(Struct):
    input_tokens: int  # the state once plus every answered question
    output_tokens: int = 0


class DecisionsResponse(Struct, omit_defaults=True):
    model: str
    answers: dict[str, DecisionAnswer]
    usage: DecisionsUsage
    meta: ResponseMeta | None = None


class BatchResult(Struct):
    id: StateId
    answers: dict[str, DecisionAnswer]
    usage: DecisionsUsage


class DecisionsBatchResponse(Struct, omit_defaults=True):
    model: str
    results: list[BatchResult]
    usage: DecisionsUsage
    meta: ResponseMeta | None = None


decisions_decoder = msgspec.json.Decoder(DecisionsRequest)
batch_decoder = msgspec.json.Decoder(DecisionsBatchRequest)
