"""Wire schemas of the decision surfaces (R-API-4/5): the upstream contract's `DecisionRequest`
and `DecisionResponse` (OpenAPI 2.3.0), which TypeSafe SystemOne requests are a subset of.

`POST /v1/decisions` and its alias `POST /v1/systemone` take `{model?, state, questions,
states?, images?, videos?, assets?, options?}`; our extension `POST /v1/systemone/batches` takes
`{model?, states: [{id, state}], questions, options?}`. `images` and `videos` (data URLs; a
state's entry may carry its own) and TypeSafe's `assets` are read by models whose card lists the
`image` (and `video`) modality (`surfaces/decision_media.py`).

The request's frame is strict (an unknown top-level or option field is a 400), but each
question is decoded as a plain JSON value (`DecisionsBody`, `DecisionsBatchBody`: what the
decoders give the handlers) and read in its own slot (`surfaces/decision_questions.py`): an
unknown type or field, or a bad count, fails that question alone with `invalid_question`.
`QuestionSpec` is every field a question may hold, what the reader converts a question to once
its fields fit its type. The OpenAPI document describes the requests with one Struct per
question type (`NoulQuestion` … `SpanQuestion`, in `DecisionsRequest`): the questions a client
should send, which `tests/unit/test_decision_questions.py` holds to the reader's field lists.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

from vllm_srun.adapters.schemas.common import CommonOptions, ItemErrorCode, ResponseMeta, Strict, Usage

MAX_QUESTIONS = 1024  # per request: its own questions and every `states` entry's (states × questions for a batch)
MAX_ROWS = 4096  # per request: noul rows once set and span questions are laid out (all states together)
MIN_LABELS, MAX_LABELS = 1, 255  # set and span questions
MAX_LABEL_CHARS = 256
Content = str | dict[str, Any] | list[Any]
LabelName = Annotated[str, Meta(min_length=1, max_length=MAX_LABEL_CHARS)]
Coverage = Literal["complete"]  # `input_coverage`: a require_full_input question read every state part whole


class ChoiceOption(Strict):
    """One entry of an ordered `choices` or `labels` list."""

    key: LabelName
    description: Content | None = None


class QuestionSpec(Strict):
    """One question, as the contract writes it: `type` and the fields its type takes.

    choice: `criteria` {option: description|null} or `choices` [{key, description}], 2–255;
    noul: `criteria` {true?, false?} or `choices` keyed `true`/`false`, optional;
    score: `criteria` or `levels`, an ordered list of 2–10 level descriptions;
    set, span: `criteria` {label: description|null} or `labels` [name | {key, description}],
    1–255, and `threshold` in [0, 1]. Any type: `instructions`, `over`, `require_full_input`,
    `overflow`; span: `head`. `preset` names a question the model defines (ours define none).
    """

    type: str | None = None
    instructions: Content | None = None
    criteria: Any = None
    choices: list[ChoiceOption] | None = None
    levels: list[Content] | None = None
    labels: list[LabelName | ChoiceOption] | None = None
    over: str | list[str] | None = None
    require_full_input: bool = False
    overflow: Literal["window", "truncate"] | None = None
    head: Literal["router", "broad"] | None = None
    threshold: float | None = None
    preset: str | None = None


# ---- the questions as the OpenAPI document describes them (one Struct per type) ----------------
Threshold = Annotated[float, Meta(ge=0.0, le=1.0)]
Over = str | list[str]
Labels = Annotated[list[LabelName | ChoiceOption], Meta(min_length=MIN_LABELS, max_length=MAX_LABELS)]
LabelCriteria = Annotated[dict[str, Content | None], Meta(min_length=MIN_LABELS, max_length=MAX_LABELS)]


class NoulCriteria(Strict):
    true: Content | None = None
    false: Content | None = None


class _AnyQuestion(Strict):
    instructions: Content | None = None
    over: Over | None = None
    require_full_input: bool = False
    overflow: Literal["window", "truncate"] | None = None
    preset: str | None = None


class NoulQuestion(_AnyQuestion, tag_field="type", tag="noul"):
    criteria: NoulCriteria | None = None
    choices: Annotated[list[ChoiceOption], Meta(max_length=2)] | None = None  # keys `true` / `false`


class ChoiceQuestion(_AnyQuestion, tag_field="type", tag="choice"):
    criteria: Annotated[dict[str, Content | None], Meta(min_length=2, max_length=255)] | None = None
    choices: Annotated[list[ChoiceOption], Meta(min_length=2, max_length=255)] | None = None


class ScoreQuestion(_AnyQuestion, tag_field="type", tag="score"):
    criteria: Annotated[list[Content], Meta(min_length=2, max_length=10)] | None = None
    levels: Annotated[list[Content], Meta(min_length=2, max_length=10)] | None = None


class SetQuestion(_AnyQuestion, tag_field="type", tag="set"):
    criteria: LabelCriteria | None = None
    labels: Labels | None = None
    threshold: Threshold | None = None


class SpanQuestion(_AnyQuestion, tag_field="type", tag="span"):
    criteria: LabelCriteria | None = None
    labels: Labels | None = None
    threshold: Threshold | None = None
    head: Literal["router", "broad"] | None = None


Question = NoulQuestion | ChoiceQuestion | ScoreQuestion | SetQuestion | SpanQuestion
QUESTION_TYPES: tuple[type[_AnyQuestion], ...] = (
    NoulQuestion,
    ChoiceQuestion,
    ScoreQuestion,
    SetQuestion,
    SpanQuestion,
)
Images = list[str]  # data URLs of PNG, JPEG or WebP images: models with the `image` modality read them
Videos = list[str]  # data URLs of MP4/QuickTime or Matroska/WebM videos: models with the `video` modality


class Asset(Strict):
    """A TypeSafe media asset, keyed in `assets` by the placeholder text that stands for it in the
    state: its bytes as base64 (`data_base64`, with the `format` the client names; the bytes
    decide), or, in a multipart request, the part holding them (`part`)."""

    type: Literal["image"] | None = None
    format: str | None = None
    data_base64: str | None = None
    part: str | None = None


StateName = Annotated[str, Meta(min_length=1, max_length=256)]


class DecisionsOptions(CommonOptions):
    # the scan budget of models that read long state parts in windows; ours read one bounded input
    max_tokens: Annotated[int, Meta(ge=1)] | None = None


class DecisionState(Strict):
    """One entry of a request's `states`: a further state with its own questions."""

    state: Content
    questions: Annotated[dict[str, Question], Meta(min_length=1)]
    images: Images | None = None
    videos: Videos | None = None


class DecisionsRequest(Strict):
    """The request as the OpenAPI document describes it (the handlers get `DecisionsBody`)."""

    state: Content
    questions: Annotated[dict[str, Question], Meta(min_length=1)]
    model: str | None = None
    options: DecisionsOptions | None = None
    states: dict[StateName, DecisionState] | None = None
    images: Images | None = None
    videos: Videos | None = None
    assets: dict[str, Asset] | None = None  # TypeSafe media assets (images of the state)


# ---- the requests as decoded: each question kept as sent, read in its slot --------------------
Questions = Annotated[dict[str, Any], Meta(min_length=1)]


class DecisionStateBody(Strict):
    state: Content
    questions: Questions
    images: Images | None = None
    videos: Videos | None = None


class DecisionsBody(Strict):
    state: Content
    questions: Questions
    model: str | None = None
    options: DecisionsOptions | None = None
    states: dict[StateName, DecisionStateBody] | None = None
    images: Images | None = None
    videos: Videos | None = None
    assets: dict[str, Asset] | None = None


# an id is echoed in the answer: a string, or a signed 64-bit integer (what every encoder and client holds)
StateId = str | Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]


class BatchState(Strict):
    id: StateId
    state: Content


class DecisionsBatchRequest(Strict):
    """The batch request as the OpenAPI document describes it (the handler gets `DecisionsBatchBody`)."""

    states: Annotated[list[BatchState], Meta(min_length=1)]
    questions: Annotated[dict[str, Question], Meta(min_length=1)]
    model: str | None = None
    options: DecisionsOptions | None = None


class DecisionsBatchBody(Strict):
    states: Annotated[list[BatchState], Meta(min_length=1)]
    questions: Questions
    model: str | None = None
    options: DecisionsOptions | None = None


class DecisionAnswer(Struct, omit_defaults=True):
    """One question's answer; the fields present depend on `type`, or `error` and `message`
    when it failed (`type` is then the type it was sent with, null when it sent none)."""

    type: str | None
    noul: float | None = None  # noul: P(yes)
    choice: str | None = None  # choice: the most probable option
    score: float | None = None  # score: the expected level, Σ level × P(level)
    confidence: float | None = None  # choice/score: 1 − the normalised entropy of `probabilities`
    legend: dict[str, str] | None = None  # score: level → its description (an object's or array's as JSON)
    probabilities: dict[str, float] | None = None  # choice: option → P; score: level → P
    input_coverage: Coverage | None = None  # require_full_input: every state part was read whole
    error: ItemErrorCode | None = None
    message: str | None = None


class SetResult(Struct, omit_defaults=True):
    selected: list[str]  # the labels with P(yes) >= threshold, in the question's order
    probabilities: dict[str, float]  # label → P(yes)
    input_coverage: Coverage | None = None


class SpanItem(Struct):
    label: str
    start: int  # code points of the text the question read, end exclusive
    end: int
    text: str
    probability: float  # the mean P(yes) of the span's words


DecisionsUsage = Usage  # the state once plus every answered question; output_tokens is always 0


class DecisionStateResponse(Struct, omit_defaults=True):
    """The answers about one entry of the request's `states`, as its own request would get them."""

    model: str
    answers: dict[str, DecisionAnswer]
    usage: Usage
    sets: dict[str, SetResult] | None = None
    spans: dict[str, list[SpanItem]] | None = None
    thresholds: dict[str, float] | None = None
    meta: ResponseMeta | None = None


class DecisionsResponse(Struct, omit_defaults=True):
    model: str
    answers: dict[str, DecisionAnswer]
    usage: Usage  # the request's own state alone
    meta: ResponseMeta | None = None
    sets: dict[str, SetResult] | None = None  # set questions
    spans: dict[str, list[SpanItem]] | None = None  # span questions
    thresholds: dict[str, float] | None = None  # set and span questions: the threshold applied
    states: dict[str, DecisionStateResponse] | None = None  # the request's `states`, by name


class BatchResult(Struct, omit_defaults=True):
    id: StateId
    answers: dict[str, DecisionAnswer]
    usage: Usage
    sets: dict[str, SetResult] | None = None
    spans: dict[str, list[SpanItem]] | None = None
    thresholds: dict[str, float] | None = None


class DecisionsBatchResponse(Struct, omit_defaults=True):
    model: str
    results: list[BatchResult]
    usage: Usage
    meta: ResponseMeta | None = None


decisions_decoder = msgspec.json.Decoder(DecisionsBody)
batch_decoder = msgspec.json.Decoder(DecisionsBatchBody)
