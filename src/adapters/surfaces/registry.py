"""The surfaces' routes: the wire table (`schemas/routes.py`) with each path's handler.

The HTTP app builds its POST routes from this table, and the golden check (R-GOLD-1) runs
recorded requests through the same handlers, so the readiness check and the HTTP app never
depend on each other. A handler is `async (served, request, timing, disconnected) -> Struct`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import msgspec

from vllm_srun.adapters.schemas.routes import SURFACE_SCHEMAS, SurfaceSchema
from vllm_srun.adapters.surfaces import decisions
from vllm_srun.adapters.surfaces.classify import classify
from vllm_srun.adapters.surfaces.cohere import embed_v2
from vllm_srun.adapters.surfaces.embeddings import embeddings
from vllm_srun.adapters.surfaces.rerank import rerank, rerank_v2

SurfaceHandler = Callable[..., Awaitable[msgspec.Struct]]

HANDLERS: dict[str, SurfaceHandler] = {
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
class SurfaceRoute:
    schema: SurfaceSchema
    handler: SurfaceHandler

    @property
    def path(self) -> str:
        return self.schema.path

    @property
    def surface(self) -> str:
        return self.schema.surface

    @property
    def decoder(self) -> msgspec.json.Decoder:
        return self.schema.decoder


# every one-model surface; `/v1/bundle` spans models and has a handler of its own (`bundle.py`)
SURFACE_ROUTES: tuple[SurfaceRoute, ...] = tuple(
    SurfaceRoute(s, HANDLERS[s.path]) for s in SURFACE_SCHEMAS if s.path in HANDLERS
)
