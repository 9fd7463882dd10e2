"""What every surface's wire schema shares: strict Structs, the common options, the response meta
(R-API-8), the per-item error and the usage of the upstream contract (docs/contract.md).
Decoders are built once; unknown fields are refused."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta, Struct

from vllm_srun.domain.scheduling.tenants import Priority

# The version of the upstream model-runtime contract (vllm-project/semantic-router's OpenAPI
# document) these surfaces speak: `/health`, `/health/live` and `/v1/models` report it as
# `api_version`, and a client refuses another major version.
API_VERSION = "2.3.0"

MAX_INPUTS = 2048
PositiveMs = Annotated[float, Meta(gt=0)]
# a profile's name (R-PROF): `exact`, or one the server enabled for the model (its card's `profiles`)
ProfileName = Annotated[str, Meta(pattern=r"^[a-z][a-z0-9_]*$", max_length=64)]

# Why one item (an input, a document, a question) has no result, while the others of its request
# are answered (the contract's `ItemError`): the slot carries `error: "<code>"` and a `message`.
ItemErrorCode = Literal[
    "invalid_question",
    "invalid_input",
    "max_length_exceeded",
    "scan_budget_exceeded",
    "invalid_model_output",
    "deadline_exceeded",
    "unavailable",
]


class Strict(Struct, forbid_unknown_fields=True, omit_defaults=False):
    pass


class CommonOptions(Strict):
    return_meta: bool = False
    deadline_ms: PositiveMs | None = None
    priority: Priority | None = None  # R-FAIR-3: interactive rows of a tenant before its batch rows; unset: by size
    profile: ProfileName | None = None  # R-PROF: unset means the model's serving profile


class Usage(Struct):
    """Tokens a classify, rerank or decisions answer read (`output_tokens` is always 0: nothing is generated)."""

    input_tokens: int
    output_tokens: int = 0


class Representation(Struct, omit_defaults=True):
    """The identity of an embedding space (`meta.representation`): vectors of different ones never mix."""

    model_sha256: str
    layer: int
    dimension: int
    normalized: bool | None = None
    modality: str | None = None


class ResponseMeta(Struct, omit_defaults=True):
    """`meta` of an answer when `options.return_meta` is set (R-API-8): the contract's fields
    (model_id … representation) and ours (dtype, forward_ms = compute_ms, forwards, rows,
    padded_tokens, cache_hit)."""

    numerics: str
    dtype: str
    device: str
    engine: str
    queue_ms: float
    forward_ms: float
    forwards: int
    rows: int
    padded_tokens: int
    cache_hit: bool = False
    model_id: str | None = None
    revision: str | None = None
    model_sha256: str | None = None
    profile: str | None = None
    accelerator: str | None = None
    compute_ms: float | None = None
    head: str | None = None
    representation: Representation | None = None


json_encoder = msgspec.json.Encoder()
