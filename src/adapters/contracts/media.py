"""Media (R-MEDIA): what decodes images and videos (`MediaDecoder`) and audio (`AudioDecoder`),
the jobs it is given (`ImageJob`, `VideoJob`, `ClipJob`, `AudioJob`: a closed set, each mapped to
one decoder method by `decode`), and what the event loop awaits (`MediaLoader`).

A `VisionPreprocess` is the preprocessing of a vision-language model (Qwen3.5's processor): it
makes each image's pixels itself (their size depends on the image) and says how many frames of a
video it reads; a `ClipJob` samples a video for it and answers a `SampledVideo` (the frames' pixels
and their times).

Media worker processes import this module, and with it the contracts package: the standard
library and the pure domain at run time, never torch (array types are named for the type checker
only).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol, assert_never, runtime_checkable

from vllm_srun.adapters.contracts.common import CardFields

if TYPE_CHECKING:  # types only
    import numpy as np
    from numpy.typing import NDArray
    from PIL.Image import Image

__all__ = [
    "AudioDecoder",
    "AudioJob",
    "ClipDecoder",
    "ClipJob",
    "ImageJob",
    "MediaDecoder",
    "MediaError",
    "MediaJob",
    "MediaLimits",
    "MediaLoader",
    "MediaWorkerDied",
    "PixelSpec",
    "SampledVideo",
    "VideoJob",
    "VisionPreprocess",
    "decode",
]

# What the decoder does to every image and frame (the model's `preprocess`, e.g.
# `media/preprocess.ImagePreprocess`): agreed between a media model and its decoder; the core
# only keys its decode cache by it and hands it to the decoder, so hashable (and picklable: it
# crosses into media worker processes) is all it needs to be here.
PixelSpec = Hashable


def _mib(n: int) -> str:
    return f"{n / (1024 * 1024):.1f} MiB"


@dataclass(frozen=True)
class MediaLimits:
    """Bounds of one image or video, checked before its pixels are decoded (R-MEDIA)."""

    max_bytes: int
    max_pixels: int  # of an image, or of one video frame
    max_frames: int = 0  # video: most frames a request may sample
    max_duration_s: float = 0.0  # video: longest duration
    max_decoded_frames: int = 0  # video: most frames decoded to find the samples
    formats: tuple[str, ...] = ()  # the formats read (image: pillow's names; video: demuxers); empty: every one

    def check_bytes(self, data: bytes, what: str) -> None:
        """MediaError unless DATA (an image or a video, WHAT) holds 1..max_bytes bytes."""
        if not data:
            raise MediaError(f"the {what} is empty")
        if len(data) > self.max_bytes:
            raise MediaError(
                f"the {what} is {len(data)} bytes ({_mib(len(data))}), over the limit of {self.max_bytes} bytes"
            )


class MediaError(ValueError):
    """Bad or oversize media (one line saying why, without the input's index)."""


class MediaWorkerDied(RuntimeError):
    """The media worker decoding an input died (`exited`) or overran its time (`timeout`) before it
    answered: the server's fault, not the input's; only the request it held fails."""

    def __init__(self, message: str, reason: str = "exited") -> None:
        super().__init__(message)
        self.reason = reason


@runtime_checkable
class MediaDecoder(Protocol):
    """Turns image and video bytes into preprocessed pixels (R-MEDIA). Synchronous: it runs in
    media worker processes, or in a thread of the request path with `--media-workers 0`."""

    def image(self, data: bytes, limits: MediaLimits, preprocess: PixelSpec) -> NDArray[np.float32]:
        """One image → float32 [3, H, W]; raises MediaError for bad or oversize media."""
        ...

    def video_frames(self, data: bytes, frames: int, limits: MediaLimits, preprocess: PixelSpec) -> NDArray[np.float32]:
        """FRAMES frames sampled uniformly over the video's duration → float32 [FRAMES, 3, H, W];
        raises MediaError for bad or oversize media."""
        ...


@runtime_checkable
class VisionPreprocess(Protocol):
    """The preprocessing of a vision-language model: it makes each image's (and each sampled video
    frame's) pixels itself, at a size that depends on the image, and decides how many frames of a
    video it reads. Torch-free, hashable and picklable: it runs in media worker processes and keys
    the decode cache."""

    @property
    def frame_multiple(self) -> int:
        """A video's sampled frames are padded to a multiple of this (the last one repeated)."""
        ...

    def image_pixels(self, image: Image) -> NDArray[np.float32]:
        """One upright image (any mode) → float32 [3, H, W], resized and normalised."""
        ...

    def frames_for(self, duration_s: float) -> int:
        """How many frames a video lasting DURATION_S seconds is sampled into (before padding)."""
        ...

    def frame_pixels(self, image: Image, frames: int) -> NDArray[np.float32]:
        """One sampled frame (any mode) of a video sampled into FRAMES frames → float32 [3, H, W]
        (the same H × W for every frame of the video: they are all the size of this one)."""
        ...


@dataclass(frozen=True, eq=False)
class SampledVideo:
    """A video as a `VisionPreprocess` reads it (`ClipJob`)."""

    pixels: NDArray[np.float32]  # [frames, 3, H, W]
    times: tuple[float, ...]  # each sampled frame's start, in seconds from the video's first frame

    @property
    def nbytes(self) -> int:
        return int(self.pixels.nbytes)


@runtime_checkable
class ClipDecoder(Protocol):
    """Samples a video as a vision-language model reads it (a `MediaDecoder` may also be one)."""

    def clip(self, data: bytes, limits: MediaLimits, preprocess: PixelSpec) -> SampledVideo:
        """One video sampled as PREPROCESS (a `VisionPreprocess`) says: its frames' pixels and
        times; raises MediaError for bad or oversize media."""
        ...


@runtime_checkable
class AudioDecoder(Protocol):
    """Turns audio bytes into the features an audio model reads (a decoder may also be one)."""

    def audio(self, data: bytes, fmt: str, limits: MediaLimits, preprocess: PixelSpec) -> NDArray[np.float32]:
        """One file in FMT (wav, flac, mp3, ogg) → its features as PREPROCESS says (mono, resampled
        to the model's rate first); raises MediaError for bad, lying or oversize audio."""
        ...


@dataclass(frozen=True)
class ImageJob:
    """Decode one image (`MediaDecoder.image`)."""

    kind: ClassVar[str] = "image"
    data: bytes
    limits: MediaLimits
    preprocess: PixelSpec


@dataclass(frozen=True)
class VideoJob:
    """Sample FRAMES frames of one video (`MediaDecoder.video_frames`)."""

    kind: ClassVar[str] = "video"
    data: bytes
    frames: int
    limits: MediaLimits
    preprocess: PixelSpec


@dataclass(frozen=True)
class ClipJob:
    """Sample one video as a `VisionPreprocess` reads it (`ClipDecoder.clip`)."""

    kind: ClassVar[str] = "video"
    data: bytes
    limits: MediaLimits
    preprocess: PixelSpec


@dataclass(frozen=True)
class AudioJob:
    """Decode one audio file into features (`AudioDecoder.audio`)."""

    kind: ClassVar[str] = "audio"
    data: bytes
    fmt: str  # the format the request declares (checked against the bytes)
    limits: MediaLimits
    preprocess: PixelSpec


MediaJob = ImageJob | VideoJob | ClipJob | AudioJob  # every job a decoder is given (pickled to media worker processes)
MEDIA_JOBS = (ImageJob, VideoJob, ClipJob, AudioJob)  # the same, for isinstance checks on what a socket delivered


def decode(decoder: MediaDecoder, job: MediaJob) -> NDArray[np.float32] | SampledVideo:
    """Run JOB on DECODER: the one place a job kind meets the decoder method that does it."""
    if isinstance(job, ImageJob):
        return decoder.image(job.data, job.limits, job.preprocess)
    if isinstance(job, VideoJob):
        return decoder.video_frames(job.data, job.frames, job.limits, job.preprocess)
    if isinstance(job, ClipJob):
        if not isinstance(decoder, ClipDecoder):
            raise TypeError(f"{type(decoder).__name__} samples no video for a vision-language model")
        return decoder.clip(job.data, job.limits, job.preprocess)
    if isinstance(job, AudioJob):
        if not isinstance(decoder, AudioDecoder):
            raise TypeError(f"{type(decoder).__name__} decodes no audio")
        return decoder.audio(job.data, job.fmt, job.limits, job.preprocess)
    assert_never(job)


class MediaLoader(Protocol):
    """The event loop's way to a `MediaDecoder`: decodes off the loop (worker processes or a
    thread), once per content (R-PERF-4: a bounded cache keyed by the bytes' hash)."""

    def start(self) -> None:
        """Start the media workers (when a model that reads media loads; blocking, not on the loop)."""
        ...

    async def image(self, data: bytes, limits: MediaLimits, preprocess: PixelSpec) -> NDArray[np.float32]: ...

    async def video(
        self, data: bytes, frames: int, limits: MediaLimits, preprocess: PixelSpec
    ) -> NDArray[np.float32]: ...

    async def clip(self, data: bytes, limits: MediaLimits, preprocess: PixelSpec) -> SampledVideo:
        """A video sampled as PREPROCESS (a `VisionPreprocess`) reads it."""
        ...

    async def audio(self, data: bytes, fmt: str, limits: MediaLimits, preprocess: PixelSpec) -> NDArray[np.float32]: ...

    def card(self) -> CardFields:
        """The card's `media` fields: workers and the decode cache."""
        ...

    async def stop(self) -> None: ...
