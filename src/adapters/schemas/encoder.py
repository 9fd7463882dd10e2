"""Wire schemas of the encoder surfaces beyond embeddings: classify (R-API-2) and rerank
(R-API-3, Cohere/Jina-compatible). Decoders are built once; unknown fields are refused."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

from vllm_srun.adapters.schemas.common import CommonOptions, ResponseMeta, Strict

Overflow = Literal["reject", "truncate", "window"]
Aggregation = Literal["simple", "first", "none"]  # token heads: how token labels become spans


class WindowOptions(Strict):
    """Windows of `tokens` tokens (special tokens included) that share `overlap` tokens."""

    tokens: Annotated[int, Meta(ge=3)]
    overlap: Annotated[int, Meta(ge=0)] = 0


class ClassifyOptions(CommonOptions):
    # None: "window" when `window` is given, else "reject" (never cut silently, R-PERF-5)
    overflow: Overflow | None = None
    window: WindowOptions | None = None
    threshold: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None  # multi-label heads
    aggregation: Aggregation | None = None  # token heads; None: "simple"
    return_tokens: bool | None = None  # token heads: every token's label too


class PairInput(Strict):
    text: str
    text_pair: str


class ClassifyRequest(Strict):
    input: str | Annotated[list[str | PairInput], Meta(min_length=1)]
    model: str | None = None
    options: ClassifyOptions | None = None


class TokenSpan(Struct):
    """A labelled span of a token head's input: code-point offsets, END exclusive; TEXT = input[start:end]."""

    label: str
    start: int
    end: int
    text: str
    probability: float


class WindowSpan(Struct, omit_defaults=True):
    start: int  # character offsets of the windowed text (the `text_pair` of a pair) in this window
    end: int
    tokens: int
    probabilities: list[float] = msgspec.field(default_factory=list)  # sequence heads
    spans: list[TokenSpan] | None = None  # token heads: this window's own spans, before the union


class InputInfo(Struct, omit_defaults=True):
    tokens: int  # the input's full length in tokens, special tokens included
    truncated: bool
    windows: list[WindowSpan] | None = None


class TokenLabel(Struct):
    """One (non-special) token of a token head's input and its most probable label."""

    token: str
    start: int
    end: int
    label: str
    probability: float


class ClassifyResult(Struct, omit_defaults=True, kw_only=True):
    """A sequence head's result has `label` and `probabilities`; a token head's has `spans` (and
    `tokens` when asked for)."""

    index: int
    label: str | list[str] | None = None  # single-label: the argmax; multi-label: every label >= threshold
    probabilities: list[float] | None = None  # in the order of the response's `labels`
    spans: list[TokenSpan] | None = None  # token heads: labels other than "O", by `options.aggregation`
    tokens: list[TokenLabel] | None = None  # token heads, `options.return_tokens`
    input: InputInfo


class Usage(Struct):
    prompt_tokens: int
    total_tokens: int


class ClassifyResponse(Struct, omit_defaults=True):
    model: str
    labels: list[str]
    results: list[ClassifyResult]
    usage: Usage
    multi_label: bool
    kind: Literal["sequence", "token"] = "sequence"  # the head's kind (omitted for a sequence head)
    object: str = "classification"
    meta: ResponseMeta | None = None


class RerankOptions(CommonOptions):
    overflow: Overflow | None = None
    window: WindowOptions | None = None


class RerankRequest(Strict):
    query: Annotated[str, Meta(min_length=1)]
    documents: Annotated[list[str | dict[str, Any]], Meta(min_length=1)]
    model: str | None = None
    top_n: Annotated[int, Meta(ge=1)] | None = None
    return_documents: bool | None = None
    # Cohere client fields: rank_fields picks the keys of object documents (v1); max_tokens_per_doc
    # truncates each document (v2); priority is accepted and has no effect on one worker
    rank_fields: Annotated[list[str], Meta(min_length=1)] | None = None
    max_tokens_per_doc: Annotated[int, Meta(ge=1)] | None = None
    priority: int | None = None
    max_chunks_per_doc: None = None  # Cohere v1 chunking: use options.overflow="window" instead
    options: RerankOptions | None = None


class RerankResult(Struct, omit_defaults=True):
    index: int
    relevance_score: float
    document: dict[str, Any] | None = None


class RerankResponse(Struct, omit_defaults=True):
    model: str
    results: list[RerankResult]
    usage: Usage
    id: str = ""
    meta: ResponseMeta | None = None


classify_decoder = msgspec.json.Decoder(ClassifyRequest)
rerank_decoder = msgspec.json.Decoder(RerankRequest)
