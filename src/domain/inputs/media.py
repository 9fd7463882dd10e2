"""Media rules (R-MEDIA): how many media workers decode, the default limits of one image, video
or audio input, which frames of a video are sampled, and which audio format a file's first bytes
claim. Pure: numbers in, numbers out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

MIB = 1024 * 1024

CPUS_PER_MEDIA_WORKER = 16
MAX_DEFAULT_MEDIA_WORKERS = 4

# limits of one input, checked before any pixel is decoded (a package's srun.json may lower them)
IMAGE_MAX_BYTES = 16 * MIB
IMAGE_MAX_PIXELS = 50_000_000  # e.g. 8,660 × 5,773; larger is refused as a decompression bomb
VIDEO_MAX_BYTES = 48 * MIB
VIDEO_MAX_FRAME_PIXELS = 3840 * 2160  # one frame: 4K
VIDEO_MAX_SECONDS = 120.0
VIDEO_MAX_DECODED_FRAMES = 7200  # 120 s at 60 frames per second
VIDEO_FRAMES = 8  # frames sampled from a video when neither the request nor the package says
VIDEO_MAX_FRAMES = 32

# audio (`input_audio` items): limits checked from the header before any sample is decoded, and
# again while decoding (a package's srun.json may lower the bytes and seconds; a model's window
# may lower the seconds further)
AUDIO_FORMATS = ("wav", "flac", "mp3", "ogg")
AUDIO_MAX_BYTES = 16 * MIB
AUDIO_MAX_SECONDS = 60.0
AUDIO_MIN_RATE = 1_000  # samples per second a file may declare; outside: refused as absurd
AUDIO_MAX_RATE = 384_000
AUDIO_MAX_CHANNELS = 32

# decision models that read images and videos: the upstream contract's image limits and its
# runtime's video limits (one image or video; the videos of one request share a token budget)
DECISION_IMAGE_MAX_BYTES = 8_000_000
DECISION_IMAGE_SOURCE_MAX_PIXELS = 16_000_000
DECISION_IMAGE_FORMATS = ("PNG", "JPEG", "WEBP")
DECISION_VIDEO_MAX_BYTES = 32_000_000
DECISION_VIDEO_SOURCE_MAX_PIXELS = 3840 * 2160
DECISION_VIDEO_MAX_SECONDS = 300.0
DECISION_VIDEO_MAX_DECODED_FRAMES = 18_000  # 300 s at 60 frames per second
DECISION_VIDEO_FORMATS = ("mov", "matroska")  # MP4/QuickTime, Matroska/WebM (demuxer names)
DECISION_VIDEO_MAX_TOKENS = 16_384

# the decode cache (R-PERF-4): repeated images and videos are decoded and preprocessed once
DECODE_CACHE_ENTRIES = 256
DECODE_CACHE_BYTES = 256 * MIB


def default_media_workers(cpu_budget: float) -> int:
    """One media worker per 16 CPUs of the budget (a quota may be fractional), at least 1, at most 4."""
    return max(1, min(MAX_DEFAULT_MEDIA_WORKERS, int(cpu_budget // CPUS_PER_MEDIA_WORKER)))


def sample_times(start: float, duration: float, frames: int) -> list[float]:
    """The instants FRAMES samples are taken at: the middles of FRAMES equal slices of the video."""
    if frames < 1:
        raise ValueError("a video is sampled at least once")
    return [start + duration * (i + 0.5) / frames for i in range(frames)]


def pick_frames(times: Sequence[float], targets: Sequence[float]) -> list[int]:
    """For each target instant, the index of the frame shown then: the last frame that starts at
    or before it (the first frame for an instant before every frame). TIMES ascend."""
    if not times:
        raise ValueError("no frames to pick from")
    picked = []
    j = 0
    for target in targets:
        while j + 1 < len(times) and times[j + 1] <= target:
            j += 1
        picked.append(j)
    return picked


class FramePicker:
    """`pick_frames` over a stream of frames, holding none of them: give it each frame's start
    time in decode order (`offer`) and it says which targets the *previous* frame serves; the
    first frame also serves the targets before it; `finish` gives the last frame the rest."""

    def __init__(self, targets: Sequence[float]) -> None:
        self.targets = list(targets)
        self._next = 0
        self._frames = 0

    @property
    def done(self) -> bool:
        """Every target has its frame: nothing later can change the picks."""
        return self._next >= len(self.targets)

    def offer(self, time: float) -> list[int]:
        """A frame starting at TIME arrived: the targets before it belong to the frame before it
        (or, for the first frame, to it)."""
        self._frames += 1
        served = []
        while self._next < len(self.targets) and self.targets[self._next] < time:
            served.append(self._next)
            self._next += 1
        return served

    def finish(self) -> list[int]:
        """The stream ended: the targets left belong to its last frame."""
        if self._frames == 0:
            raise ValueError("no frames to pick from")
        rest = list(range(self._next, len(self.targets)))
        self._next = len(self.targets)
        return rest


def audio_format(head: bytes) -> str | None:
    """The audio format (of `AUDIO_FORMATS`) a file's first bytes claim, or None."""
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return "wav"
    if head.startswith(b"fLaC"):
        return "flac"
    if head.startswith(b"OggS"):
        return "ogg"
    if head.startswith(b"ID3") or (len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0):
        return "mp3"  # an ID3 tag, or an MPEG audio frame's sync word
    return None


# ---------------------------------------------------------------------------------------------
# Qwen vision sizes (Qwen3.5's vision tower): how large an image or a video's frames are resized,
# which frames of a video are read, and how many language-model tokens they become. The rules of
# transformers' Qwen2-VL image processor and Qwen3-VL video processor, as numbers.

QWEN_MAX_ASPECT = 200  # a longer side over 200 times the shorter is refused
QWEN_VIDEO_RATE = 2.0  # frames read per second of video
QWEN_VIDEO_MIN_FRAMES = 4
QWEN_VIDEO_MAX_FRAMES = 32


def _aspect(height: int, width: int) -> None:
    if height < 1 or width < 1:
        raise ValueError(f"an image of {width}x{height} pixels has no area")
    if max(height, width) / min(height, width) > QWEN_MAX_ASPECT:
        raise ValueError(f"an aspect ratio over {QWEN_MAX_ASPECT}:1 is refused ({width}x{height} pixels)")


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(height, width) an image is resized to: each a multiple of FACTOR (patch × merge), as near
    the original as that allows, the area within [MIN_PIXELS, MAX_PIXELS] (aspect kept)."""
    _aspect(height, width)
    h = round(height / factor) * factor
    w = round(width / factor) * factor
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    if h < 1 or w < 1:
        raise ValueError(f"an image of {width}x{height} pixels is too small to resize")
    return h, w


def video_smart_resize(
    frames: int, height: int, width: int, temporal: int, factor: int, min_pixels: int, max_pixels: int
) -> tuple[int, int]:
    """(height, width) every frame of a video is resized to: as `smart_resize`, the budget counting
    all FRAMES (rounded to TEMPORAL); frames smaller than FACTOR are first scaled up to it."""
    if frames < temporal:
        raise ValueError(f"a video needs at least {temporal} frames (got {frames})")
    if height < 1 or width < 1:
        raise ValueError(f"a video of {width}x{height} pixels has no area")
    h, w = float(height), float(width)
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        h, w = float(int(height * scale)), float(int(width * scale))
    _aspect(int(h), int(w))
    t_bar = round(frames / temporal) * temporal
    rh = round(h / factor) * factor
    rw = round(w / factor) * factor
    if t_bar * rh * rw > max_pixels:
        beta = math.sqrt(frames * h * w / max_pixels)
        return max(factor, math.floor(h / beta / factor) * factor), max(factor, math.floor(w / beta / factor) * factor)
    if t_bar * rh * rw < min_pixels:
        beta = math.sqrt(min_pixels / (frames * h * w))
        return math.ceil(h * beta / factor) * factor, math.ceil(w * beta / factor) * factor
    return rh, rw


def qwen_frame_count(
    total: int,
    fps: float,
    rate: float = QWEN_VIDEO_RATE,
    min_frames: int = QWEN_VIDEO_MIN_FRAMES,
    max_frames: int = QWEN_VIDEO_MAX_FRAMES,
) -> int:
    """How many of a video's TOTAL frames (at FPS per second) are read: RATE per second of video,
    at least MIN_FRAMES and at most MAX_FRAMES, never more than it has."""
    if total < 1:
        raise ValueError("the video has no frames")
    if not fps > 0:
        raise ValueError(f"a frame rate must be positive (got {fps})")
    count = int(total / fps * rate)
    return max(1, min(max(count, min_frames), max_frames, total))


def qwen_frame_indices(
    total: int,
    fps: float,
    rate: float = QWEN_VIDEO_RATE,
    min_frames: int = QWEN_VIDEO_MIN_FRAMES,
    max_frames: int = QWEN_VIDEO_MAX_FRAMES,
) -> list[int]:
    """The frames read (`qwen_frame_count` of them), spread evenly from the first to the last:
    index k of n is round(k × (TOTAL-1) / (n-1)), halves to even as numpy rounds."""
    count = qwen_frame_count(total, fps, rate, min_frames, max_frames)
    if count == 1:
        return [0]
    step = (total - 1) / (count - 1)
    return [round(k * step) if k < count - 1 else total - 1 for k in range(count)]


def group_times(times: Sequence[float], temporal: int) -> list[float]:
    """One instant per group of TEMPORAL frames (the frames' times padded by repeating the last):
    the mean of the group's first and last frame."""
    if not times:
        raise ValueError("no frame times")
    padded = list(times) + [times[-1]] * (-len(times) % temporal)
    return [(padded[i] + padded[i + temporal - 1]) / 2 for i in range(0, len(padded), temporal)]


def vision_tokens(grid_t: int, grid_h: int, grid_w: int, merge: int) -> int:
    """Language-model tokens a (t, h, w) patch grid becomes: MERGE × MERGE patches make one."""
    if grid_h % merge or grid_w % merge:
        raise ValueError(f"a patch grid of {grid_h}x{grid_w} does not divide into {merge}x{merge} blocks")
    return grid_t * grid_h * grid_w // (merge * merge)
