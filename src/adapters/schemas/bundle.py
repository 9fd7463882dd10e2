"""Wire schema of `POST /v1/bundle` (R-PERF-1): several surface requests in one call.

`{tasks: [{id, embeddings|classify|rerank|decisions: <that surface's request body>}],
options: {deadline_ms}}` → `{results: [{id, status, <surface>: <its response> | error}]}`, in
task order. `status` is the HTTP status the task would have had as a call of its own.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta, Struct

from vllm_srun.adapters.schemas.common import PositiveMs, Strict
from vllm_srun.adapters.schemas.decisions import DecisionsRequest, DecisionsResponse
from vllm_srun.adapters.schemas.embeddings import EmbeddingsRequest, EmbeddingsResponse
from vllm_srun.adapters.schemas.encoder import ClassifyRequest, ClassifyResponse, RerankRequest, RerankResponse

TASK_SURFACES = ("embeddings", "classify", "rerank", "decisions")


class BundleOptions(Strict):
    deadline_ms: PositiveMs | None = None  # for every task; a task's own `options.deadline_ms` may be sooner


class BundleTask(Strict):
    """One task: its id and exactly one surface's request body."""

    id: Annotated[str, Meta(min_length=1, max_length=256)]
    embeddings: EmbeddingsRequest | None = None
    classify: ClassifyRequest | None = None
    rerank: RerankRequest | None = None
    decisions: DecisionsRequest | None = None


class BundleRequest(Strict):
    tasks: Annotated[list[BundleTask], Meta(min_length=1)]
    options: BundleOptions | None = None


class TaskError(Struct):
    code: str
    message: str


class TaskResult(Struct, omit_defaults=True):
    id: str
    status: int
    embeddings: EmbeddingsResponse | None = None
    classify: ClassifyResponse | None = None
    rerank: RerankResponse | None = None
    decisions: DecisionsResponse | None = None
    error: TaskError | None = None


class BundleResponse(Struct):
    results: list[TaskResult]
    object: str = "bundle"


bundle_decoder = msgspec.json.Decoder(BundleRequest)
