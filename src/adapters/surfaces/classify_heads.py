"""The head of a classify model (R-API-2): its name, its kind in the upstream contract's terms,
and the request fields that depend on them (`head`, the options a kind takes, `meta.head`).

Every model has one head, named `classify` (the card's `heads[0].name`); its kind is `token`
(a token head), `scores` (multi-label: a sigmoid per label) or `sequence` (softmax)."""

from __future__ import annotations

from typing import Any

import msgspec

from vllm_srun.adapters.contracts.token_heads import is_token_classifier
from vllm_srun.adapters.schemas.encoder import ClassifyOptions, ClassifyResponse
from vllm_srun.domain.errors import InvalidRequest, quoted

HEAD_NAME = "classify"  # the one head of every classify model (the card's heads[0].name)


def head_kind(model: Any) -> str:
    """The contract's kind of MODEL's head: token, scores (multi-label) or sequence."""
    if is_token_classifier(model) and model.classify_kind == "token":
        return "token"
    return "scores" if model.multi_label else "sequence"


def check_head(head: str | None) -> None:
    """400 for a `head` the model does not have (it has one, `HEAD_NAME`)."""
    if head is not None and head != HEAD_NAME:
        raise InvalidRequest(f"unknown head {quoted(head)}; this model's heads: {HEAD_NAME}")


def check_options(options: ClassifyOptions, kind: str) -> str:
    """The aggregation a request asks for; 400 for options its head's KIND (sequence, scores,
    token) does not take."""
    if kind != "token":
        for name in ("aggregation", "return_tokens"):
            if getattr(options, name) is not None:
                raise InvalidRequest(f"options.{name} applies to token heads; this model's head labels whole inputs")
        if kind == "sequence" and options.threshold is not None:
            raise InvalidRequest(
                "options.threshold applies to scores (multi-label) and token heads; this model's head is a "
                "sequence head (softmax: its label is the most probable one)"
            )
        return ""
    return options.aggregation or "simple"


def with_head(response: ClassifyResponse) -> ClassifyResponse:
    """RESPONSE with `meta.head` when it has meta."""
    if response.meta is None:
        return response
    return msgspec.structs.replace(response, meta=msgspec.structs.replace(response.meta, head=HEAD_NAME))
