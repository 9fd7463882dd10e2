"""Pixels for Qwen3.5's vision tower, as the package's `preprocessor_config.json` (images) and
`video_preprocessor_config.json` (videos; the image file when there is none) say. Pillow and
numpy only: it runs in media worker processes.

`VisionPreprocess.from_folder(folder)` reads both files (keys a file leaves out take the defaults
of transformers' `Qwen2VLImageProcessor` and `Qwen3VLVideoProcessor`). Then:

- `image_pixels(image)` → float32 [3, H, W]: RGB (`preprocess.to_rgb`), resized with pillow's
  filter (`resample`, bicubic) to `smart_resize`'s size (both sides multiples of patch × merge,
  the area within `size.shortest_edge`..`size.longest_edge`), rescaled in float64 and cast to
  float32, normalized (x − mean) / std in float32: transformers' PIL image processor, step by step.
- `video_pixels(frames)` → float32 [T, 3, H, W], T a multiple of the temporal patch (the last
  frame repeated): every frame resized to one size (`video_smart_resize` over the sampled frame
  count, optionally capped per frame as the video processor's `cap_pixels_per_frame` does) by the
  bicubic antialiased 8-bit resize torchvision runs on a CPU (`resample.py`, bit-exact with it;
  `frame_pixels` does one frame), then rescale and normalize fused as the video processor does
  ((x − mean/r) / (std/r), float32). Videos need torchvision in transformers; images do not,
  and its PIL image processor (pillow's resize) is the one we follow for images.
- which frames a video reads (`frame_indices`: 2 per second, 4 to 32, spread over the whole
  video; domain `qwen_frame_indices`), the tokens a medium becomes (`tokens`) and the prompt
  text that stands for it (`image_placeholder`, `video_placeholder`: transformers' Qwen3-VL
  processor's expansion, a `<t seconds>` stamp before every group of `temporal_patch_size` frames).

The model patchifies these arrays itself (`models/qwen3_5_vision.py`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from vllm_srun.adapters.media.preprocess import RESAMPLE_NAMES, to_rgb
from vllm_srun.adapters.media.resample import resize_bicubic_aa
from vllm_srun.domain.inputs.media import (
    QWEN_VIDEO_MAX_FRAMES,
    QWEN_VIDEO_MIN_FRAMES,
    QWEN_VIDEO_RATE,
    group_times,
    qwen_frame_indices,
    smart_resize,
    video_smart_resize,
    vision_tokens,
)

IMAGE_CONFIG = "preprocessor_config.json"
VIDEO_CONFIG = "video_preprocessor_config.json"
VISION_START, VISION_END = "<|vision_start|>", "<|vision_end|>"
IMAGE_PAD, VIDEO_PAD = "<|image_pad|>", "<|video_pad|>"
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
HALF = (0.5, 0.5, 0.5)
# transformers' class defaults, for keys a package's file leaves out
IMAGE_DEFAULTS: dict[str, Any] = {
    "min_pixels": 56 * 56,
    "max_pixels": 28 * 28 * 1280,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": CLIP_MEAN,
    "image_std": CLIP_STD,
    "rescale_factor": 1 / 255,
    "resample": 3,
}
VIDEO_DEFAULTS: dict[str, Any] = {
    "min_pixels": 128 * 32 * 32,
    "max_pixels": 32 * 32 * 768,
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": HALF,
    "image_std": HALF,
    "rescale_factor": 1 / 255,
    "resample": 3,
    "fps": QWEN_VIDEO_RATE,
    "min_frames": QWEN_VIDEO_MIN_FRAMES,
    "max_frames": QWEN_VIDEO_MAX_FRAMES,
    "cap_pixels_per_frame": False,
    "max_video_tokens": 768,
}
_FIXED = {"do_resize": True, "do_rescale": True, "do_normalize": True, "do_convert_rgb": True}


@dataclass(frozen=True)
class Sizing:
    """One processor's numbers (images or videos)."""

    patch: int
    temporal: int
    merge: int
    min_pixels: int
    max_pixels: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    rescale: float
    resample: int

    @property
    def factor(self) -> int:
        return self.patch * self.merge


@dataclass(frozen=True)
class VisionPreprocess:
    """What a Qwen3.5 package's processor files ask for (frozen, hashable, picklable: it crosses
    into media worker processes and keys the decode cache)."""

    image: Sizing
    video: Sizing
    video_rate: float = QWEN_VIDEO_RATE  # frames read per second
    video_min_frames: int = QWEN_VIDEO_MIN_FRAMES
    video_max_frames: int = QWEN_VIDEO_MAX_FRAMES
    cap_pixels_per_frame: bool = False
    max_video_tokens: int = 768  # tokens one frame may take under the cap

    @classmethod
    def from_folder(cls, folder: str | Path, max_frames: int = QWEN_VIDEO_MAX_FRAMES) -> VisionPreprocess:
        """The spec of FOLDER's processor files; a video reads at most MAX_FRAMES frames."""
        folder = Path(folder)
        image_raw = _read(folder / IMAGE_CONFIG)
        video_path = folder / VIDEO_CONFIG
        video_raw = _read(video_path) if video_path.is_file() else image_raw
        return cls.from_configs(image_raw, video_raw, max_frames)

    @classmethod
    def from_configs(
        cls, image_raw: dict[str, Any], video_raw: dict[str, Any], max_frames: int = QWEN_VIDEO_MAX_FRAMES
    ) -> VisionPreprocess:
        image = _sizing(image_raw, IMAGE_DEFAULTS, IMAGE_CONFIG)
        video = _sizing(video_raw, VIDEO_DEFAULTS, VIDEO_CONFIG)
        if video.resample != 3:
            raise ValueError(f"{VIDEO_CONFIG} resample {video.resample}: videos are resized bicubic (3) only")
        v = {**VIDEO_DEFAULTS, **video_raw}
        rate = float(v["fps"] if v.get("fps") is not None else QWEN_VIDEO_RATE)
        low = int(v["min_frames"] if v.get("min_frames") is not None else QWEN_VIDEO_MIN_FRAMES)
        high = min(int(v["max_frames"] if v.get("max_frames") is not None else max_frames), max_frames)
        if not rate > 0 or low < 1 or high < low:
            raise ValueError(f"{VIDEO_CONFIG}: fps {rate}, min_frames {low}, max_frames {high} make no sampling")
        return cls(
            image,
            video,
            rate,
            low,
            high,
            bool(v.get("cap_pixels_per_frame") or False),
            int(v.get("max_video_tokens") or 768),
        )

    def key(self) -> str:
        """A short stable text naming this spec (part of the decode cache key)."""
        return repr(self)

    # ---- sizes -----------------------------------------------------------------------------
    def image_size(self, height: int, width: int) -> tuple[int, int]:
        s = self.image
        return smart_resize(height, width, s.factor, s.min_pixels, s.max_pixels)

    def video_size(self, frames: int, height: int, width: int) -> tuple[int, int]:
        """(height, width) of every frame of a video read as FRAMES frames (as sampled, before padding)."""
        s = self.video
        budget = s.max_pixels
        if self.cap_pixels_per_frame:
            per_frame = max(min(self.max_video_tokens * s.factor**2, s.max_pixels // frames), int(s.min_pixels * 1.05))
            budget = per_frame * frames
        return video_smart_resize(frames, height, width, s.temporal, s.factor, s.min_pixels, budget)

    def frame_indices(self, total: int, fps: float) -> list[int]:
        """The frames of a video of TOTAL frames at FPS that are read."""
        return qwen_frame_indices(total, fps, self.video_rate, self.video_min_frames, self.video_max_frames)

    def frames_for(self, duration_s: float, total: int | None = None) -> int:
        """How many frames a video of DURATION_S seconds (TOTAL frames, when known) reads: the
        rate per second, within the frame bounds, never more than it has (`video_pixels` repeats
        the last one when the count is odd)."""
        count = min(max(int(duration_s * self.video_rate), self.video_min_frames), self.video_max_frames)
        return max(1, min(count, total)) if total is not None else count

    def grid(self, kind: str, shape: Sequence[int]) -> tuple[int, int, int]:
        """(t, h, w) patch grid of pixels of SHAPE ([3, H, W] image: t = 1, the frame repeated over
        the temporal patch; [T, 3, H, W] video)."""
        if kind == "image":
            _, height, width = shape
            return 1, height // self.image.patch, width // self.image.patch
        frames, _, height, width = shape
        return -(-frames // self.video.temporal), height // self.video.patch, width // self.video.patch

    def tokens(self, kind: str, shape: Sequence[int]) -> tuple[int, int]:
        """(groups, tokens per group): an image is one group; a video one per `temporal_patch_size` frames."""
        t, h, w = self.grid(kind, shape)
        merge = self.image.merge if kind == "image" else self.video.merge
        return t, vision_tokens(1, h, w, merge)

    # ---- pixels ----------------------------------------------------------------------------
    def image_pixels(self, image: Image.Image) -> np.ndarray:
        """IMAGE (any mode, already upright) → float32 [3, H, W] (module doc)."""
        rgb = to_rgb(image)
        height, width = self.image_size(rgb.height, rgb.width)
        if (height, width) != (rgb.height, rgb.width):
            rgb = rgb.resize((width, height), resample=Image.Resampling(self.image.resample))
        return _apply(np.asarray(rgb, dtype=np.uint8), _image_tables(self.image))

    @property
    def frame_multiple(self) -> int:
        """A video's frames come in groups of this many (the temporal patch): pad by repeating the last."""
        return self.video.temporal

    def frame_pixels(self, image: Image.Image, frames: int) -> np.ndarray:
        """One sampled frame of a video read as FRAMES frames (before any padding) → float32
        [3, H, W], H × W the size all of that video's frames take (`video_size`)."""
        rgb = to_rgb(image)
        height, width = self.video_size(frames, rgb.height, rgb.width)
        array = np.asarray(rgb, dtype=np.uint8)
        if (height, width) != (rgb.height, rgb.width):
            array = resize_bicubic_aa(array, height, width)
        return _apply(array, _video_tables(self.video))

    def video_pixels(self, frames: Sequence[Image.Image]) -> np.ndarray:
        """FRAMES (decoded, in order, one size) → float32 [T, 3, H, W], T a multiple of the
        temporal patch (the last frame repeated); the size is reckoned on the frames as given."""
        if not frames:
            raise ValueError("a video needs at least one frame")
        if len({f.size for f in frames}) != 1:
            raise ValueError("all frames of a video must have one size")
        pixels = [self.frame_pixels(f, len(frames)) for f in frames]
        pixels += [pixels[-1]] * (-len(pixels) % self.frame_multiple)
        return np.stack(pixels)


def image_placeholder(tokens: int) -> str:
    """The prompt text that stands for an image of TOKENS tokens."""
    return VISION_START + IMAGE_PAD * tokens + VISION_END


def video_placeholder(tokens_per_group: int, times: Sequence[float]) -> str:
    """The prompt text that stands for a video: for each group of frames, its time, then its tokens."""
    return "".join(f"<{t:.1f} seconds>" + VISION_START + VIDEO_PAD * tokens_per_group + VISION_END for t in times)


def video_group_times(frame_times: Sequence[float], temporal: int) -> list[float]:
    """The time of each group of TEMPORAL frames (domain `group_times`)."""
    return group_times(frame_times, temporal)


# ---- helpers ------------------------------------------------------------------------------
def _read(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ValueError(f"a Qwen3.5 vision package needs {path.name}")
    raw = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(raw, dict):
        raise ValueError(f"{path.name} must be a JSON object")
    return raw


def _triple(value: Any, name: str, where: str) -> tuple[float, float, float]:
    if isinstance(value, (int, float)):
        v = float(value)
        return (v, v, v)
    if isinstance(value, (list, tuple)) and len(value) == 3 and all(isinstance(v, (int, float)) for v in value):
        return (float(value[0]), float(value[1]), float(value[2]))
    raise ValueError(f"{where} {name} must be a number or three numbers (got {value!r})")


def _sizing(raw: dict[str, Any], defaults: dict[str, Any], where: str) -> Sizing:
    changed = sorted(k for k, v in _FIXED.items() if raw.get(k, v) != v)
    if changed:
        raise ValueError(f"{where} turns off {', '.join(changed)}, which Qwen3.5 packages are not served with")
    c = {**defaults, **{k: v for k, v in raw.items() if v is not None}}
    given = raw.get("size")
    size: dict[str, Any] = given if isinstance(given, dict) else {}
    low = int(size.get("shortest_edge") or c["min_pixels"])
    high = int(size.get("longest_edge") or c["max_pixels"])
    if raw.get("min_pixels") is not None:
        low = int(raw["min_pixels"])
    if raw.get("max_pixels") is not None:
        high = int(raw["max_pixels"])
    ints = {k: int(c[k]) for k in ("patch_size", "temporal_patch_size", "merge_size", "resample")}
    if min(ints["patch_size"], ints["temporal_patch_size"], ints["merge_size"]) < 1 or not 0 < low <= high:
        raise ValueError(f"{where}: patch, merge and temporal sizes must be >= 1 and 0 < min_pixels <= max_pixels")
    if ints["resample"] not in RESAMPLE_NAMES:
        raise ValueError(f"{where} resample {ints['resample']} is not a pillow filter")
    mean, std = _triple(c["image_mean"], "image_mean", where), _triple(c["image_std"], "image_std", where)
    if any(s == 0 for s in std):
        raise ValueError(f"{where} image_std has a zero")
    return Sizing(
        ints["patch_size"],
        ints["temporal_patch_size"],
        ints["merge_size"],
        low,
        high,
        mean,
        std,
        float(c["rescale_factor"]),
        ints["resample"],
    )


def _image_tables(s: Sizing) -> np.ndarray:
    """[3, 256] float32: each 8-bit value rescaled in float64, cast, then (x − mean) / std in float32."""
    values = (np.arange(256, dtype=np.float64) * s.rescale).astype(np.float32)
    return np.stack([(values - np.float32(m)) / np.float32(d) for m, d in zip(s.mean, s.std)])


def _video_tables(s: Sizing) -> np.ndarray:
    """[3, 256] float32: (x − mean/r) / (std/r), the fused form, every term in float32."""
    values = np.arange(256, dtype=np.float32)
    inverse = np.float32(1.0 / s.rescale)
    return np.stack([(values - np.float32(m) * inverse) / (np.float32(d) * inverse) for m, d in zip(s.mean, s.std)])


def _apply(array: np.ndarray, tables: np.ndarray) -> np.ndarray:
    """[H, W, 3] uint8 through per-channel TABLES → float32 [3, H, W]."""
    out = np.empty((3, *array.shape[:2]), dtype=np.float32)
    for c in range(3):
        np.take(tables[c], array[:, :, c], out=out[c])
    return out
