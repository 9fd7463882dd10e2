"""Wire schema of `POST /v1/embeddings` (R-API-1), OpenAI-compatible and as the upstream contract
writes it (`layer`, `options.max_tokens`, `data[].input`, per-item `error`, `meta.representation`:
docs/contract.md), plus `input_type` and `prompt_name` (which of the package's sentence-transformers
prompts is prepended to the texts), `embedding_type` (dense, sparse, multi_vector) and quantized
`encoding_format`s (issue 24)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

from vllm_srun.adapters.schemas.common import CommonOptions, ItemErrorCode, ResponseMeta, Strict
from vllm_srun.adapters.schemas.encoder import InputUsage, MaxTokens
from vllm_srun.domain.inputs.media import VIDEO_MAX_FRAMES

EncodingFormat = Literal["float", "base64", "int8", "uint8", "binary", "ubinary"]
QUANTIZED = ("int8", "uint8", "binary", "ubinary")
EmbeddingType = Literal["dense", "sparse", "multi_vector"]


class EmbeddingsOptions(CommonOptions):
    overflow: Literal["reject", "truncate"] | None = None  # None: the model's input.overflow (window: reject)
    max_tokens: MaxTokens | None = None
    top_k: Annotated[int, Meta(ge=1, description="sparse: keep the K largest weights of each vector")] | None = None
    threshold: Annotated[float, Meta(ge=0, description="sparse: keep the weights larger than this")] | None = None
    special_tokens: (
        Annotated[
            Literal["exclude", "include"],
            Meta(
                description="sparse: whether special tokens' positions ([CLS], [SEP]) are pooled (default include: "
                "as sentence-transformers' SparseEncoder.encode and TEI do)"
            ),
        ]
        | None
    ) = None
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


class AudioData(Strict):
    data: Annotated[str, Meta(description="the audio file's bytes, base64 (no data: URL prefix)")]
    format: Annotated[
        Literal["wav", "flac", "mp3", "ogg"],  # domain.inputs.media.AUDIO_FORMATS
        Meta(description="what the bytes are: wav, flac, mp3 or ogg (bytes of another format are refused)"),
    ]


class AudioInput(Strict, tag_field="type", tag="input_audio"):
    """An audio file (OpenAI's `input_audio` shape) for a model that reads audio (card:
    embedding.modalities): decoded, mixed to mono and resampled to the model's rate."""

    input_audio: AudioData


InputItem = str | TextInput | ImageUrlInput | VideoUrlInput | AudioInput


class EmbeddingsRequest(Strict):
    input: str | Annotated[list[InputItem], Meta(min_length=1)]
    model: str | None = None
    encoding_format: Annotated[
        EncodingFormat,
        Meta(
            description="float or base64 (little-endian float32); int8, uint8, binary, ubinary: "
            "sentence-transformers' quantize_embeddings (the ranges used are in the response's quantization)"
        ),
    ] = "float"
    base64: Annotated[
        bool, Meta(description="a quantized encoding_format as base64 of its bytes (int8/binary: signed bytes)")
    ] = False
    embedding_type: Annotated[
        EmbeddingType,
        Meta(
            description="dense: one vector; sparse: {indices, values} over the vocabulary (SPLADE); multi_vector: "
            "one normalised vector per token (card: embedding.outputs)"
        ),
    ] = "dense"
    dimensions: (
        Annotated[
            int,
            Meta(
                ge=1,
                description="keep the first N dimensions (renormalised for a normalized model): one the card's "
                "embedding.dimensions lists, or any smaller (a Matryoshka cut)",
            ),
        ]
        | None
    ) = None
    layer: Annotated[int, Meta(ge=1, description="a layer exit the model declares (card embedding.layers)")] | None = (
        None
    )
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


class SparseEmbedding(Struct):
    """A sparse vector: vocabulary ids (ascending) and their weights."""

    indices: list[int]
    values: list[float]


class Embedding(Struct, omit_defaults=True, kw_only=True):
    """One input's vector and its `input` usage; a failed input: `object`, `index`, `error`, `message`."""

    object: Literal["embedding"]  # required, so that omit_defaults never drops it
    index: int
    # dense: floats (or ints when quantized); multi_vector: a list of float lists; base64: a string
    embedding: list[Any] | str | SparseEmbedding | None = None
    input: InputUsage | None = None
    error: ItemErrorCode | None = None
    message: str | None = None


class Quantization(Struct, omit_defaults=True):
    """How a quantized encoding_format was made: int8/uint8 `ranges` ([min per dimension], [max per
    dimension]) and where they come from (`package`: its embedding_ranges.json; `fixed`: [-1, 1]
    for a normalized model); binary/ubinary: sign bits, no ranges."""

    encoding_format: str
    ranges: list[list[float]] | None = None
    ranges_from: str | None = None


class EmbeddingsUsage(Struct):
    prompt_tokens: int
    total_tokens: int


class EmbeddingsResponse(Struct, omit_defaults=True, kw_only=True):
    # required, so that omit_defaults never drops it: the OpenAI shape always says `object: "list"`
    object: Literal["list"]
    data: list[Embedding]
    model: str
    usage: EmbeddingsUsage
    quantization: Quantization | None = None
    meta: ResponseMeta | None = None


embeddings_decoder = msgspec.json.Decoder(EmbeddingsRequest)
