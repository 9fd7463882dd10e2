"""Wire schema of `POST /v1/embeddings` (R-API-1), OpenAI-compatible."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

from vllm_srun.adapters.schemas.common import CommonOptions, ResponseMeta, Strict


class EmbeddingsOptions(CommonOptions):
    overflow: Literal["reject", "truncate"] = "reject"


class TextInput(Strict, tag_field="type", tag="text"):
    text: str


class ImageUrlInput(Strict, tag_field="type", tag="image_url"):
    image_url: Any


class VideoUrlInput(Strict, tag_field="type", tag="video_url"):
    video_url: Any


InputItem = str | TextInput | ImageUrlInput | VideoUrlInput


class EmbeddingsRequest(Strict):
    input: str | Annotated[list[InputItem], Meta(min_length=1)]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Meta(ge=1)] | None = None
    user: str | None = None
    options: EmbeddingsOptions | None = None


class Embedding(Struct):
    index: int
    embedding: list[float] | str
    object: str = "embedding"


class EmbeddingsUsage(Struct):
    prompt_tokens: int
    total_tokens: int


class EmbeddingsResponse(Struct, omit_defaults=True, kw_only=True):
    # required, so that omit_defaults never drops it: the OpenAI shape always says `object: "list"`
    object: Literal["list"]
    data: list[Embedding]
    model: str
    usage: EmbeddingsUsage
    meta: ResponseMeta | None = None


embeddings_decoder = msgspec.json.Decoder(EmbeddingsRequest)
