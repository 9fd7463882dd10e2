"""The surfaces' routes: the wire table (`schemas/routes.py`) with each path's handler.

The HTTP app builds its POST routes from this table, and the golden check (R-GOLD-1) runs
recorded requests through the same handlers, so the readiness check and the HTTP app never
depend on each other. A handler is `async (served, request, call) -> response`: the model it
serves, the decoded request and the request's `Call` (`adapters/call.py`), the same for every
caller (the HTTP app, the golden check; a bundle's tasks use the surfaces' prepare steps).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeAlias, TypeVar

import msgspec

from vllm_srun.adapters.call import Call
from vllm_srun.adapters.schemas.routes import SURFACE_SCHEMAS, SurfaceSchema
from vllm_srun.adapters.serving.served import ServedModel
from vllm_srun.adapters.surfaces import decisions
from vllm_srun.adapters.surfaces.classify import classify
from vllm_srun.adapters.surfaces.cohere import embed_v2
from vllm_srun.adapters.surfaces.embeddings import embeddings
from vllm_srun.adapters.surfaces.rerank import rerank, rerank_v2

Req = TypeVar("Req", bound=msgspec.Struct)
# a surface: the model, its decoded request, its call -> its answer
SurfaceHandler: TypeAlias = Callable[[ServedModel, Req, Call], Awaitable[msgspec.Struct]]

HANDLERS: dict[str, SurfaceHandler[Any]] = {
    "/v1/embeddings": embeddings,
    "/v2/embed": embed_v2,
    "/v1/classify": classify,
    "/v1/rerank": rerank,
    "/v2/rerank": rerank_v2,  # Cohere's route: Cohere's document form, no per-document errors
    "/v1/decisions": decisions.decisions,
    "/v1/systemone": decisions.systemone,
    "/v1/systemone/batches": decisions.systemone_batches,
}


@dataclass(frozen=True)
class SurfaceRoute(Generic[Req]):
    schema: SurfaceSchema
    handler: SurfaceHandler[Req]

    @property
    def path(self) -> str:
        return self.schema.path

    @property
    def surface(self) -> str:
        return self.schema.surface

    @property
    def decoder(self) -> msgspec.json.Decoder[Any]:
        return self.schema.decoder


# every one-model surface; `/v1/bundle` spans models and has a handler of its own (`bundle.py`)
SURFACE_ROUTES: tuple[SurfaceRoute[Any], ...] = tuple(
    SurfaceRoute(s, HANDLERS[s.path]) for s in SURFACE_SCHEMAS if s.path in HANDLERS
)
