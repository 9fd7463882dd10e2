"""The surfaces' wire table: path, surface name, request decoder and wire types of every POST
route. The worker's app adds the handlers (`surfaces/registry.py`); the OpenAPI document of the
worker and of the front is generated from this table alone."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from vllm_srun.adapters.schemas.bundle import BundleRequest, BundleResponse, bundle_decoder
from vllm_srun.adapters.schemas.cohere import EmbedV2Request, EmbedV2Response, embed_v2_decoder
from vllm_srun.adapters.schemas.decisions import (
    DecisionsBatchRequest,
    DecisionsBatchResponse,
    DecisionsRequest,
    DecisionsResponse,
    batch_decoder,
    decisions_decoder,
)
from vllm_srun.adapters.schemas.embeddings import EmbeddingsRequest, EmbeddingsResponse, embeddings_decoder
from vllm_srun.adapters.schemas.encoder import (
    ClassifyRequest,
    ClassifyResponse,
    RerankRequest,
    RerankResponse,
    classify_decoder,
    rerank_decoder,
)


@dataclass(frozen=True)
class SurfaceSchema:
    path: str
    surface: str
    decoder: msgspec.json.Decoder[Any]
    request_type: type
    response_type: type


SURFACE_SCHEMAS: tuple[SurfaceSchema, ...] = (
    SurfaceSchema("/v1/embeddings", "embeddings", embeddings_decoder, EmbeddingsRequest, EmbeddingsResponse),
    # Cohere's embed v2 (ClientV2.embed): a surface name of its own, so the golden table keeps /v1/embeddings'
    SurfaceSchema("/v2/embed", "embed", embed_v2_decoder, EmbedV2Request, EmbedV2Response),
    SurfaceSchema("/v1/classify", "classify", classify_decoder, ClassifyRequest, ClassifyResponse),
    # Jina and the Cohere v1 client post to /v1/rerank, the Cohere v2 client (ClientV2) to /v2/rerank
    SurfaceSchema("/v1/rerank", "rerank", rerank_decoder, RerankRequest, RerankResponse),
    SurfaceSchema("/v2/rerank", "rerank", rerank_decoder, RerankRequest, RerankResponse),
    # decision models (R-API-4): /v1/systemone is the path the typesafe-sdk client posts to
    SurfaceSchema("/v1/decisions", "decisions", decisions_decoder, DecisionsRequest, DecisionsResponse),
    SurfaceSchema("/v1/systemone", "systemone", decisions_decoder, DecisionsRequest, DecisionsResponse),
    SurfaceSchema(
        "/v1/systemone/batches", "systemone_batches", batch_decoder, DecisionsBatchRequest, DecisionsBatchResponse
    ),
    # several of the surfaces above in one call (R-PERF-1); its handler is not a one-model surface's
    SurfaceSchema("/v1/bundle", "bundle", bundle_decoder, BundleRequest, BundleResponse),
)
BUNDLE_PATH = "/v1/bundle"
