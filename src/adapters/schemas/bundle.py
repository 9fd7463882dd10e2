"""Wire schema of `POST /v1/bundle` (R-PERF-1): several surface requests in one call.

`{tasks: [{id, embeddings|classify|rerank|decisions: <that surface's request body>}],
options: {deadline_ms}}` → `{results: [{id, status, <surface>: <its response> | error}]}`, in
task order. `status` is the HTTP status the task would have had as a call of its own.

`bundle_decoder` reads the bundle's frame strictly (a malformed frame fails the whole bundle)
and each task's body with its surface's own decoder; a body that decoder refuses is kept as
that task's error (400 in its slot), so the other tasks are still answered. The JSON limits of
every body (depth, 64-bit integers: `http/request_body.py`) still apply to the whole document.
"""

from __future__ import annotations

from typing import Annotated, Any, cast

import msgspec
from msgspec import Meta, Struct

from vllm_srun.adapters.schemas.common import PositiveMs, Strict
from vllm_srun.adapters.schemas.decisions import DecisionsRequest, DecisionsResponse, decisions_decoder
from vllm_srun.adapters.schemas.embeddings import EmbeddingsRequest, EmbeddingsResponse, embeddings_decoder
from vllm_srun.adapters.schemas.encoder import (
    ClassifyRequest,
    ClassifyResponse,
    RerankRequest,
    RerankResponse,
    classify_decoder,
    rerank_decoder,
)

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


# ---- reading a bundle: its frame strictly, each task's body on its own -------------------------

TaskId = Annotated[str, Meta(min_length=1, max_length=256)]
_NO_BODY = (b"", b"null")  # a surface field left out (or null)
_BODY_DECODERS: dict[str, msgspec.json.Decoder[Any]] = {
    "embeddings": embeddings_decoder,
    "classify": classify_decoder,
    "rerank": rerank_decoder,
    "decisions": decisions_decoder,
}


class _FrameTask(Strict):
    """A task as its frame is read: the bodies stay JSON text until their surface reads them."""

    id: TaskId
    embeddings: msgspec.Raw = msgspec.Raw()
    classify: msgspec.Raw = msgspec.Raw()
    rerank: msgspec.Raw = msgspec.Raw()
    decisions: msgspec.Raw = msgspec.Raw()


class _Frame(Strict):
    tasks: Annotated[list[_FrameTask], Meta(min_length=1)]
    options: BundleOptions | None = None


class ReadTask(Struct):
    """A task as read: the surfaces it names and, for the one it names, its request or why that
    surface's decoder refused its body (one line)."""

    id: str
    surfaces: tuple[str, ...]
    body: Any = None  # the surface's request Struct
    error: str | None = None


class ReadBundle(Struct):
    tasks: list[ReadTask]
    options: BundleOptions | None = None


def _read_task(task: _FrameTask) -> ReadTask:
    raws = {name: bytes(getattr(task, name)) for name in TASK_SURFACES}
    surfaces = tuple(name for name, raw in raws.items() if raw not in _NO_BODY)
    if len(surfaces) != 1:  # refused whole (`surfaces/bundle.py`); no body is read
        return ReadTask(task.id, surfaces)
    try:
        return ReadTask(task.id, surfaces, body=_BODY_DECODERS[surfaces[0]].decode(raws[surfaces[0]]))
    except msgspec.ValidationError as exc:
        return ReadTask(task.id, surfaces, error=(str(exc).splitlines() or ["invalid body"])[0][:300])
    except msgspec.DecodeError as exc:  # the frame parsed it as JSON; its strings may still be refused
        return ReadTask(task.id, surfaces, error=f"the body is not valid JSON: {str(exc)[:200]}")


class BundleDecoder:
    """Reads a `/v1/bundle` body into a `ReadBundle` (the route's decoder, `schemas/routes.py`)."""

    _frame = msgspec.json.Decoder(_Frame)
    type = BundleRequest  # the wire type it reads, as a msgspec decoder names it (`Decoder.type`)

    def decode(self, buf: bytes) -> ReadBundle:
        frame = self._frame.decode(buf)  # a malformed frame raises: 400 for the whole bundle
        return ReadBundle([_read_task(task) for task in frame.tasks], frame.options)


# used where the routes hold msgspec decoders: only its `decode` is ever called
bundle_decoder = cast("msgspec.json.Decoder[ReadBundle]", BundleDecoder())
