"""Media rules (R-MEDIA): how many media workers decode, the default limits of one image, video
or audio input, which frames of a video are sampled, and which audio format a file's first bytes
claim. Pure: numbers in, numbers out.
"""

from __future__ import annotations

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
