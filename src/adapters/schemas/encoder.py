"""Wire schemas of the encoder surfaces beyond embeddings: classify (R-API-2) and rerank
(R-API-3), as the upstream contract writes them (docs/contract.md), with our extensions in
fields of their own. Decoders are built once; unknown fields are refused.

An item (an input, a document) that fails has `error` (an `ItemErrorCode`) and `message` in its
slot, and nothing else but its index (R-API-10)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

from vllm_srun.adapters.schemas.common import CommonOptions, ItemErrorCode, ResponseMeta, Strict, Usage

Overflow = Literal["reject", "truncate", "window"]
Aggregation = Literal["simple", "first", "none"]  # token heads: how token labels become spans
HeadKind = Literal["sequence", "scores", "token"]
MaxTokens = Annotated[
    int,
    Meta(ge=1, description="most tokens of one input, special tokens included (default and ceiling: the model's)"),
]


class EncoderUsage(Usage, kw_only=True):
    """The contract's usage (`input_tokens`: the tokens the forwards read; `output_tokens`: 0) and
    the OpenAI/Jina names of the same count (`prompt_tokens`, `total_tokens`), which our clients read."""

    prompt_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, tokens: int) -> EncoderUsage:
        return cls(input_tokens=tokens, output_tokens=0, prompt_tokens=tokens, total_tokens=tokens)


class WindowOptions(Strict):
    """Windows of `tokens` tokens (special tokens included) that share `overlap` content tokens."""

    tokens: Annotated[int, Meta(ge=2)]
    overlap: Annotated[int, Meta(ge=0)] = 0


class ClassifyOptions(CommonOptions):
    # None: "window" when `window` is given, else the deployment's input.overflow (reject by
    # default: never cut silently, R-PERF-5)
    overflow: Overflow | None = None
    max_tokens: MaxTokens | None = None
    window: WindowOptions | None = None
    threshold: (
        Annotated[
            float,
            Meta(
                ge=0.0,
                le=1.0,
                description="the head's decision threshold: token heads keep the spans at or above it; "
                "scores (multi-label) heads select the labels at or above it (default 0.5); refused on a "
                "sequence (softmax) head",
            ),
        ]
        | None
    ) = None
    aggregation: Aggregation | None = None  # token heads; None: "simple"
    return_tokens: bool | None = None  # token heads: every token's label probabilities too


class ClassifyItem(Strict):
    """One input in object form: `{text}` or `{text, text_pair}`; the grounded form `{context,
    question, answer}` is read, and answered `invalid_input` in its slot (no head of ours takes it)."""

    text: str | None = None
    text_pair: str | None = None
    context: str | None = None
    question: str | None = None
    answer: str | None = None


PairInput = ClassifyItem  # the name the tests and the golden files have always used


class ClassifyRequest(Strict):
    input: str | Annotated[list[str | ClassifyItem], Meta(min_length=1)]
    model: str | None = None
    head: Annotated[str, Meta(description="the head to run (default: the model's only head)")] | None = None
    options: ClassifyOptions | None = None


class TokenSpan(Struct):
    """A labelled span of a token head's input: code-point offsets, END exclusive; TEXT = input[start:end]."""

    label: str
    start: int
    end: int
    text: str
    probability: float


class InputUsage(Struct, omit_defaults=True):
    """The tokenizer's facts of one input (special tokens included): its `tokens`, the ones the
    model read (`processed_tokens`: fewer when cut; a windowed input's every token once), whether
    it was cut, and the windows it was read in."""

    tokens: int
    processed_tokens: int
    truncated: bool
    windows: int | None = None


class ClassifyWindow(Struct, omit_defaults=True, kw_only=True):
    """One window of a windowed input: `start`/`end` are offsets in the input's content tokens
    (the windowed text's, for a pair), end exclusive; `char_start`/`char_end` the same span in
    characters, `tokens` the window's row (special tokens included)."""

    start: int
    end: int
    probabilities: list[float] | None = None  # sequence heads
    scores: list[float] | None = None  # scores (multi-label) heads
    spans: list[TokenSpan] | None = None  # token heads: this window's own spans, before the union
    char_start: int
    char_end: int
    tokens: int


class TokenProbabilities(Struct, kw_only=True):
    """One (non-special) token of a token head's input: its code-point span and the probability of
    every label (in the response's `labels` order); `token`, `label` and `probability` (the most
    probable label's) are ours."""

    start: int
    end: int
    probabilities: list[float]
    token: str
    label: str
    probability: float


class ClassifyResult(Struct, omit_defaults=True, kw_only=True):
    """sequence: `label`, `probabilities`; scores: `scores`, `selected`; token: `spans` (and
    `tokens` when asked for). A failed input: `index`, `error`, `message`."""

    index: int
    label: str | None = None  # sequence heads: the most probable label
    probabilities: list[float] | None = None  # sequence heads, in the order of the response's `labels`
    scores: list[float] | None = None  # scores heads: each label's sigmoid
    selected: list[str] | None = None  # scores heads: the labels at or above the threshold, most probable first
    spans: list[TokenSpan] | None = None  # token heads: labels other than "O", by `options.aggregation`
    tokens: list[TokenProbabilities] | None = None  # token heads, `options.return_tokens`
    windows: list[ClassifyWindow] | None = None  # a windowed input's windows
    input: InputUsage | None = None
    error: ItemErrorCode | None = None
    message: str | None = None


class ClassifyResponse(Struct, omit_defaults=True, kw_only=True):
    model: str
    head: str
    kind: HeadKind  # never omitted (it has no default)
    labels: list[str]
    results: list[ClassifyResult]
    usage: EncoderUsage
    multi_label: bool
    object: str = "classification"
    meta: ResponseMeta | None = None


class RerankOptions(CommonOptions):
    overflow: Overflow | None = None  # window: ours (the best window of a document scores)
    max_tokens: MaxTokens | None = None  # per (query, document) pair
    window: WindowOptions | None = None


class RerankRequest(Strict):
    query: Annotated[str, Meta(min_length=1)]
    documents: Annotated[list[str | dict[str, Any]], Meta(min_length=1)]
    model: str | None = None
    top_n: Annotated[int, Meta(ge=1)] | None = None
    return_documents: bool | None = None
    layer: (
        Annotated[int, Meta(ge=1, description="a pair-scorer exit the model declares (card rerank.exits)")] | None
    ) = None
    dimensions: (
        Annotated[int, Meta(ge=1, description="a pair-scorer exit dimension the model declares (card rerank.exits)")]
        | None
    ) = None
    # Cohere client fields: rank_fields picks the keys of object documents (v1); max_tokens_per_doc
    # truncates each document (v2); priority is accepted and has no effect on one worker
    rank_fields: Annotated[list[str], Meta(min_length=1)] | None = None
    max_tokens_per_doc: Annotated[int, Meta(ge=1)] | None = None
    priority: int | None = None
    max_chunks_per_doc: None = None  # Cohere v1 chunking: use options.overflow="window" instead
    options: RerankOptions | None = None


class RerankResult(Struct, omit_defaults=True):
    """A scored document: `relevance_score` (sigmoid of `logit` for a cross-encoder) and, asked
    for, its `document` (the string sent; Cohere's `{text}` form for a request in Cohere's form:
    docs/contract.md). A failed document: `index`, `error`, `message`."""

    index: int
    relevance_score: float | None = None
    logit: float | None = None  # a cross-encoder's raw score (a MaxSim reranker has none)
    document: str | dict[str, Any] | None = None
    input: InputUsage | None = None
    error: ItemErrorCode | None = None
    message: str | None = None


class RerankResponse(Struct, omit_defaults=True):
    model: str
    results: list[RerankResult]
    usage: EncoderUsage
    id: str = ""
    meta: ResponseMeta | None = None


classify_decoder = msgspec.json.Decoder(ClassifyRequest)
rerank_decoder = msgspec.json.Decoder(RerankRequest)
