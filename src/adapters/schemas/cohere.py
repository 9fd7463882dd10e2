"""Wire schema of `POST /v2/embed`, Cohere's embed API (v2) as the official `cohere` client
(`ClientV2.embed`) sends and reads it: texts in, `embeddings` by type out (issue 24)."""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

from vllm_srun.adapters.schemas.common import MAX_INPUTS, Strict

CohereInputType = Literal["search_document", "search_query", "classification", "clustering", "image"]
CohereEmbeddingType = Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]


class EmbedV2Request(Strict):
    texts: Annotated[list[str], Meta(min_length=1, max_length=MAX_INPUTS)] | None = None
    model: str | None = None
    input_type: (
        Annotated[
            CohereInputType,
            Meta(
                description="search_query → the model's query prompt; search_document → its document (passage, "
                "corpus) prompt; classification, clustering → its prompt of that name; none: its default prompt"
            ),
        ]
        | None
    ) = None
    embedding_types: (
        Annotated[
            list[CohereEmbeddingType],
            Meta(
                min_length=1,
                description="float (default), int8, uint8, binary, ubinary (sentence-transformers' "
                "quantize_embeddings), base64 (little-endian float32)",
            ),
        ]
        | None
    ) = None
    truncate: (
        Annotated[
            Literal["NONE", "START", "END"],
            Meta(description="a text over the model's limit: END (default) cuts its end, START its start, NONE: 400"),
        ]
        | None
    ) = None
    max_tokens: (
        Annotated[int, Meta(ge=1, description="cut each text to this many tokens (as truncate says)")] | None
    ) = None
    output_dimension: Annotated[int, Meta(ge=1, description="keep this many dimensions (renormalised)")] | None = None
    images: list[Any] | None = None  # accepted so that the client's shape decodes; refused when given
    inputs: list[Any] | None = None
    priority: int | None = None  # accepted; no effect on one worker


class ApiVersion(Struct):
    version: str = "2"


class BilledUnits(Struct):
    input_tokens: int


class CohereMeta(Struct):
    api_version: ApiVersion
    billed_units: BilledUnits


class EmbeddingsByType(Struct, omit_defaults=True, rename={"float_": "float"}):
    float_: list[list[float]] | None = None
    int8: list[list[int]] | None = None
    uint8: list[list[int]] | None = None
    binary: list[list[int]] | None = None
    ubinary: list[list[int]] | None = None
    base64: list[str] | None = None


class EmbedV2Response(Struct, kw_only=True):
    embeddings: EmbeddingsByType
    texts: list[str]
    meta: CohereMeta
    model: str
    id: str = msgspec.field(default_factory=lambda: str(uuid.uuid4()))
    response_type: Literal["embeddings_by_type"] = "embeddings_by_type"


embed_v2_decoder = msgspec.json.Decoder(EmbedV2Request)
