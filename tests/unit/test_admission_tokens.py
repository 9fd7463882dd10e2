"""R-ADM-1's token bound before tokenization: body bytes for text, rows for media items."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from vllm_srun.adapters.schemas.embeddings import EmbeddingsRequest
from vllm_srun.adapters.serving.served import ServedModel
from vllm_srun.adapters.surfaces.admission import admission_tokens
from vllm_srun.domain.settings.engine_args import EngineArgs


@dataclass
class MediaModel:  # the MediaEmbedder attributes only
    modalities: frozenset[str] = frozenset({"text", "image", "video"})
    media_lane: str = "media"
    image_tokens: int = 50
    image_limits: Any = None
    video_limits: Any = None
    video_frames: int = 4
    preprocess: Any = None


def served_with(model: object | None) -> ServedModel:
    # only the MediaEmbedder attributes are read
    return ServedModel(name="m", artifact="m", args=EngineArgs(), device="cpu", model=model)  # type: ignore[arg-type]


def request(body: dict[str, Any]) -> tuple[EmbeddingsRequest, int]:
    raw = msgspec.json.encode(body)
    return msgspec.json.decode(raw, type=EmbeddingsRequest), len(raw)


def test_text_counts_its_body_bytes() -> None:
    req, size = request({"input": ["a few words", "more"]})
    assert admission_tokens(served_with(MediaModel()), req, size) == size


def test_media_counts_rows_not_encoded_bytes() -> None:
    url = "data:image/png;base64," + "A" * 100_000
    req, size = request(
        {
            "input": [
                {"type": "image_url", "image_url": {"url": url}},
                {"type": "video_url", "video_url": {"url": url}},
                "hi",
            ]
        }
    )
    tokens = admission_tokens(served_with(MediaModel()), req, size)
    assert tokens == size - 2 * len(url) + (1 + 4) * 50
    req, size = request({"input": [{"type": "video_url", "video_url": {"url": url}}], "options": {"frames": 8}})
    assert admission_tokens(served_with(MediaModel()), req, size) == size - len(url) + 8 * 50
