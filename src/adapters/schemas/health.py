"""`GET /health` and `GET /health/live` of a worker (R-API-7), as the contract has them.

`/health` is 200 only while every model is ready (503 otherwise, with `Retry-After`): `status`
is the worker's (`domain/worker/lifecycle.health`), `reason` why it is not ready (the first model that
is not: its reason, named when the worker serves several), `model` the served model's id when it
serves one, and `models` each model's status and reason (always listed). `/health/live` is 200
while the process answers HTTP, whatever its models do.
"""

from __future__ import annotations

from typing import Literal

from msgspec import Struct

from vllm_srun.adapters.schemas.common import API_VERSION
from vllm_srun.adapters.schemas.models_list import ModelStatus


class ModelHealth(Struct):
    status: ModelStatus
    reason: str | None


class Health(Struct):
    api_version: str
    status: ModelStatus
    reason: str | None
    model: str | None  # the served model when there is one; None when several are
    models: dict[str, ModelHealth]


class Liveness(Struct):
    api_version: str
    status: Literal["alive"]


LIVE = Liveness(API_VERSION, "alive")
