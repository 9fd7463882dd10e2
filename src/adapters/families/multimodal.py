"""The multimodal family (R-PKG-2): CLIP-style dual encoders (CLIP, SigLIP) serving
`/v1/embeddings` for text, image and video inputs in one embedding space.

A package is a Hugging Face `CLIPModel` / `SiglipModel` folder: `config.json`, safetensors,
`tokenizer.json` and `preprocessor_config.json` (how images are resized, cropped and
normalized), plus an optional `srun.json` (modalities, frames per video, lower media limits).
Text rows go to the `text` lane, image rows and video frames to the `media` lane (R-BAT-6):
the lanes never share a forward and keep their own cost per token. Published precision FP32.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vllm_srun.adapters.contracts import (
    Family,
    LoadContext,
    LoadedModel,
    MediaLimits,
    PackageInfo,
    as_dual_encoder_engine,
)
from vllm_srun.adapters.families.fixtures.multimodal_fixture import VARIANTS, write_multimodal_fixture
from vllm_srun.adapters.media.preprocess import RESAMPLE_NAMES, ImagePreprocess
from vllm_srun.adapters.models.dual_encoder_config import KINDS
from vllm_srun.adapters.models.manifest import read_manifest
from vllm_srun.adapters.models.tokenization import Encoded
from vllm_srun.domain.inputs import media
from vllm_srun.domain.scheduling.lanes import Accounting, Lane
from vllm_srun.domain.scheduling.rows import DEFAULT_LANE

FAMILY = "multimodal"
MEDIA_LANE = "media"
MODALITIES = frozenset({"text", "image", "video"})
PREPROCESSOR = "preprocessor_config.json"
GOLDEN_FILE = "golden.json"
# R-BAT-7 caps on a CPU, in padded tokens: text forwards as the encoder family's; media forwards
# smaller (an image row is as long as the vision tower's patches), so that a text request queued
# behind a round of image forwards waits for less. A cap in tokens keeps a forward's rows
# independent of timings, so the same requests always share forwards the same way.
CPU_CAP_TOKENS = 4096
CPU_MEDIA_CAP_TOKENS = 1024


def _config(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    if not path.exists():
        return {}
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}
    return raw if isinstance(raw, dict) else {}


def _limit(manifest: dict[str, Any], key: str, default: float) -> Any:
    """A limit from srun.json's `media` object: it may lower the default, never raise it."""
    value = (manifest.get("media") or {}).get(key, default)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value <= default:
        raise ValueError(f"srun.json media.{key} must be a number in (0, {default:g}] (got {value!r})")
    return type(default)(value)


def media_limits(manifest: dict[str, Any]) -> tuple[MediaLimits, MediaLimits, int]:
    """(image limits, video limits, default frames per video) of a package."""
    image = MediaLimits(
        max_bytes=_limit(manifest, "max_image_bytes", media.IMAGE_MAX_BYTES),
        max_pixels=_limit(manifest, "max_image_pixels", media.IMAGE_MAX_PIXELS),
    )
    video = MediaLimits(
        max_bytes=_limit(manifest, "max_video_bytes", media.VIDEO_MAX_BYTES),
        max_pixels=_limit(manifest, "max_video_frame_pixels", media.VIDEO_MAX_FRAME_PIXELS),
        max_frames=_limit(manifest, "max_video_frames", media.VIDEO_MAX_FRAMES),
        max_duration_s=_limit(manifest, "max_video_seconds", media.VIDEO_MAX_SECONDS),
        max_decoded_frames=_limit(manifest, "max_decoded_frames", media.VIDEO_MAX_DECODED_FRAMES),
    )
    frames = manifest.get("video_frames", min(media.VIDEO_FRAMES, video.max_frames))
    if not isinstance(frames, int) or isinstance(frames, bool) or not 1 <= frames <= video.max_frames:
        raise ValueError(f"srun.json video_frames must be an integer in [1, {video.max_frames}] (got {frames!r})")
    return image, video, frames


class MultimodalModel(LoadedModel):
    family = FAMILY
    media_lane = MEDIA_LANE
    normalized = True

    def __init__(self, folder: Path, context: LoadContext) -> None:
        import torch

        from vllm_srun.adapters.models.dual_encoder import load_dual_encoder
        from vllm_srun.adapters.models.tokenization import TextTokenizer

        manifest = read_manifest(folder)
        device = self.device = context.device
        self.dtype = context.model_dtype(FAMILY)
        context.progress(f"load: reading weights of {folder.name} ({self.dtype})")
        self.network = load_dual_encoder(folder, getattr(torch, self.dtype), device.torch_device)
        cfg = self.config = self.network.config
        self.preprocess = read_preprocess(folder, cfg.kind)
        size = cfg.vision.image_size
        if self.preprocess.output_size() != (size, size):
            raise ValueError(
                f"{PREPROCESSOR} makes images of {self.preprocess.output_size() or 'varying size'}; "
                f"the vision tower reads {size}×{size}"
            )
        self.dual_engine = as_dual_encoder_engine(context.build_engine("dual_encoder", self.network))
        self.engine = self.dual_engine
        self.tokenizer = TextTokenizer.from_folder(folder)
        limit = cfg.text.max_position_embeddings
        self.max_input_tokens = min(int(manifest.get("max_input_tokens") or limit), limit)
        self.dimensions = cfg.dimensions
        self.image_tokens = cfg.image_tokens
        self.image_limits, self.video_limits, self.video_frames = media_limits(manifest)
        self.modalities = frozenset(manifest.get("modalities") or MODALITIES)
        if not self.modalities <= MODALITIES or "text" not in self.modalities:
            raise ValueError(f"srun.json modalities must include text and name only {sorted(MODALITIES)}")
        self.surfaces = frozenset({"embeddings"})
        cpu = device.kind == "cpu"
        self.lanes = (
            Lane(DEFAULT_LANE, Accounting.PADDED, cap_tokens=CPU_CAP_TOKENS if cpu else None),
            Lane(MEDIA_LANE, Accounting.PADDED, cap_tokens=CPU_MEDIA_CAP_TOKENS if cpu else None),
        )
        golden = folder / GOLDEN_FILE
        self.golden_file = golden if golden.is_file() else None

    # TextEmbedder
    def tokenize(self, texts: Sequence[str], *, truncate: bool, max_length: int | None = None) -> list[Encoded]:
        """Token rows; SigLIP's are padded to the text tower's positions (what its forward runs,
        so the planner counts what is computed)."""
        limit = min(max_length or self.max_input_tokens, self.max_input_tokens)
        rows = self.tokenizer.encode(list(texts), max_length=limit, truncate=truncate)
        if self.config.kind != "siglip":
            return rows
        width, pad = self.config.text.max_position_embeddings, self.config.text.pad_token_id
        return [
            r
            if len(r.ids) >= width
            else Encoded([*r.ids, *[pad] * (width - len(r.ids))], [0] * width, r.truncated, r.n_tokens)
            for r in rows
        ]

    def run(self, lane: str, payloads: Sequence[Any]) -> Sequence[Any]:
        if lane == MEDIA_LANE:
            return list(self.dual_engine.embed_images(payloads))
        return list(self.dual_engine.embed_text([p.ids for p in payloads]))

    def warm_up(self) -> None:
        size = self.config.vision.image_size
        self.run(MEDIA_LANE, [np.zeros((self.config.vision.num_channels, size, size), dtype=np.float32)])
        self.run(DEFAULT_LANE, self.tokenize(["warm up"], truncate=True))

    def probe_payloads(self) -> list[Any]:
        """Text rows of mixed lengths for the batch-invariance probe (the first lane's)."""
        words = ["a", "photo", "of", "the", "red", "cat", "on", "blue", "sea", "with", "small", "birds"]
        texts = [" ".join(words[i % len(words)] for i in range(n)) for n in (1, 3, 6, 11, 20)]
        return self.tokenize(texts, truncate=True)

    def card_section(self) -> dict[str, Any]:
        p = self.preprocess
        return {
            **self.dual_engine.describe(),
            "embedding": {
                "dimensions": [self.dimensions],
                "layers": [self.config.text.num_hidden_layers],  # no early exits: the text tower's last layer
                "modalities": sorted(self.modalities),
                "normalized": self.normalized,
                "pooling": f"each {self.config.kind} tower's own, projected into one space",
                "input_types": [],
                "architecture": self.config.kind,
            },
            "limits": {  # merged into the card's limits
                "image_max_pixels": self.config.vision.image_size**2,  # what the vision tower reads
                "image_source_max_pixels": self.image_limits.max_pixels,
                "image_max_bytes": self.image_limits.max_bytes,
            },
            "media": {
                "lane": MEDIA_LANE,
                "image_tokens": self.image_tokens,
                "image": {"max_bytes": self.image_limits.max_bytes, "max_pixels": self.image_limits.max_pixels},
                "video": {
                    "max_bytes": self.video_limits.max_bytes,
                    "max_frame_pixels": self.video_limits.max_pixels,
                    "max_seconds": self.video_limits.max_duration_s,
                    "max_decoded_frames": self.video_limits.max_decoded_frames,
                    "frames": self.video_frames,
                    "max_frames": self.video_limits.max_frames,
                },
                "preprocess": {
                    "resize": {"shortest_edge": p.shortest_edge} if p.shortest_edge else _hw(p.size),
                    "resample": RESAMPLE_NAMES[p.resample],
                    "center_crop": _hw(p.crop),
                    "rescale": p.rescale,
                    "mean": p.mean,
                    "std": p.std,
                },
            },
        }


def _hw(size: tuple[int, int] | None) -> dict[str, int] | None:
    return {"height": size[0], "width": size[1]} if size is not None else None


def read_preprocess(folder: Path, kind: str) -> ImagePreprocess:
    path = Path(folder) / PREPROCESSOR
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"no {PREPROCESSOR} in {Path(folder).name}: how images are preprocessed is unknown") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return ImagePreprocess.from_config(raw, kind)


class MultimodalFamily(Family):
    name = FAMILY
    fixture_variants = VARIANTS

    def detect(self, folder: Path) -> bool:
        return _config(folder).get("model_type") in KINDS

    def describe(self, folder: Path) -> PackageInfo:
        manifest = read_manifest(folder)
        declared = manifest.get("max_input_tokens")
        return PackageInfo(self.name, frozenset({"embeddings"}), int(declared) if declared else None)

    def load(self, folder: Path, context: LoadContext) -> LoadedModel:
        return MultimodalModel(folder, context)

    def write_fixture(self, out: Path, variant: str | None, seed: int) -> list[dict[str, Any]]:
        return write_multimodal_fixture(out, variant, seed)
