"""Wire schemas (msgspec Structs). Decoders are built once; unknown fields are refused."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

import msgspec
from msgspec import Meta, Struct

MAX_INPUTS = 2048
PositiveMs = Annotated[float, Meta(gt=0)]


class Strict(Struct, forbid_unknown_fields=True, omit_defaults=False):
    pass


class CommonOptions(Strict):
    return_meta: bool = False
    deadline_ms: PositiveMs | None = None


class EmbeddingsOptions(CommonOptions):
    overflow: Literal["reject", "truncate"] = "reject"


class TextInput(Strict, tag_field="type", tag="text"):
    text: str


class ImageUrlInput(Strict, tag_field="type", tag="image_url"):
    image_url: Any


class VideoUrlInput(Strict, tag_field="type", tag="video_url"):
    video_url: Any


InputItem = Union[str, TextInput, ImageUrlInput, VideoUrlInput]


class EmbeddingsRequest(Strict):
    input: Union[str, Annotated[list[InputItem], Meta(min_length=1)]]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Meta(ge=1)] | None = None
    user: str | None = None
    options: EmbeddingsOptions | None = None


class Embedding(Struct):
    index: int
    embedding: Union[list[float], str]
    object: str = "embedding"


class EmbeddingsUsage(Struct):
    prompt_tokens: int
    total_tokens: int


class Meta_(Struct, omit_defaults=True):
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


class EmbeddingsResponse(Struct, omit_defaults=True):
    data: list[Embedding]
    model: str
    usage: EmbeddingsUsage
    object: str = "list"
    meta: Meta_ | None = None


class ErrorBody(Struct):
    code: str
    message: str


class ErrorResponse(Struct):
    error: ErrorBody


embeddings_decoder = msgspec.json.Decoder(EmbeddingsRequest)
encoder = msgspec.json.Encoder()
