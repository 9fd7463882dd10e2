"""Wire schema of `POST /v1/embeddings` (R-API-1), OpenAI-compatible, plus `input_type` and
`prompt_name` (which of the package's sentence-transformers prompts is prepended to the texts)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta, Struct

from vllm_srun.adapters.schemas.common import CommonOptions, ResponseMeta, Strict
from vllm_srun.domain.media import VIDEO_MAX_FRAMES


class EmbeddingsOptions(CommonOptions):
    overflow: Literal["reject", "truncate"] = "reject"
    frames: (
        Annotated[
            int,
            Meta(
                ge=1,
                le=VIDEO_MAX_FRAMES,
                description="frames sampled uniformly over each video's duration (default: the model's "
                "media.video.frames; at most its media.video.max_frames)",
            ),
        ]
        | None
    ) = None


class MediaUrl(Strict):
    url: Annotated[
        str, Meta(description="a data: URL, base64 (data:image/png;base64,...); no other scheme is ever fetched")
    ]


class TextInput(Strict, tag_field="type", tag="text"):
    text: str


class ImageUrlInput(Strict, tag_field="type", tag="image_url"):
    """An image (PNG, JPEG, WebP, GIF, BMP, TIFF) for a model that reads images (card: embedding.modalities)."""

    image_url: MediaUrl | str


class VideoUrlInput(Strict, tag_field="type", tag="video_url"):
    """A video (MP4/MOV, WebM/Matroska, AVI, GIF, MPEG-TS) for a model that reads videos: its sampled
    frames are embedded as images and mean-pooled."""

    video_url: MediaUrl | str


InputItem = str | TextInput | ImageUrlInput | VideoUrlInput


class EmbeddingsRequest(Strict):
    input: str | Annotated[list[InputItem], Meta(min_length=1)]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Meta(ge=1)] | None = None
    user: str | None = None
    input_type: (
        Annotated[
            Literal["query", "document"],
            Meta(
                description="what the texts are: the model's prompt for that kind (query; document or passage) is "
                "prepended to each text (card: embedding.prompts)"
            ),
        ]
        | None
    ) = None
    prompt_name: (
        Annotated[
            str,
            Meta(
                max_length=256,
                description="the model's prompt of this name is prepended to each text (card: embedding.prompts)",
            ),
        ]
        | None
    ) = None
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
