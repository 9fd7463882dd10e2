"""What every surface's wire schema shares: strict Structs, the common options and the response
meta (R-API-8). Decoders are built once; unknown fields are refused."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta, Struct

from vllm_srun.domain.tenants import Priority

MAX_INPUTS = 2048
PositiveMs = Annotated[float, Meta(gt=0)]


class Strict(Struct, forbid_unknown_fields=True, omit_defaults=False):
    pass


class CommonOptions(Strict):
    return_meta: bool = False
    deadline_ms: PositiveMs | None = None
    priority: Priority | None = None  # R-FAIR-3: interactive rows of a tenant before its batch rows; unset: by size


class ResponseMeta(Struct, omit_defaults=True):
    """`meta` of an answer when `options.return_meta` is set (R-API-8)."""

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


json_encoder = msgspec.json.Encoder()
