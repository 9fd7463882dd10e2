"""The media ports (R-MEDIA): what decodes images and videos, and what the event loop awaits.

Part of the contracts (`adapters/contracts.py` exports every name here); kept in a module of
their own so that media worker processes import them without the rest of the contracts' world.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class MediaLimits:
    """Bounds of one image or video, checked before its pixels are decoded (R-MEDIA)."""

    max_bytes: int
    max_pixels: int  # of an image, or of one video frame
    max_frames: int = 0  # video: most frames a request may sample
    max_duration_s: float = 0.0  # video: longest duration
    max_decoded_frames: int = 0  # video: most frames decoded to find the samples


class MediaError(ValueError):
    """Bad or oversize media (one line saying why, without the input's index)."""


class MediaWorkerDied(RuntimeError):
    """The media worker decoding an input died (`exited`) or overran its time (`timeout`) before it
    answered: the server's fault, not the input's; only the request it held fails."""

    def __init__(self, message: str, reason: str = "exited") -> None:
        super().__init__(message)
        self.reason = reason


class MediaDecoder(Protocol):
    """Turns image and video bytes into preprocessed pixels (R-MEDIA). Synchronous: it runs in
    media worker processes, or in a thread of the request path with `--media-workers 0`."""

    def image(self, data: bytes, limits: MediaLimits, preprocess: Any) -> Any:
        """One image → float32 [3, H, W]; raises MediaError for bad or oversize media."""
        ...

    def video_frames(self, data: bytes, frames: int, limits: MediaLimits, preprocess: Any) -> Any:
        """FRAMES frames sampled uniformly over the video's duration → float32 [FRAMES, 3, H, W];
        raises MediaError for bad or oversize media."""
        ...


class MediaLoader(Protocol):
    """The event loop's way to a `MediaDecoder`: decodes off the loop (worker processes or a
    thread), once per content (R-PERF-4: a bounded cache keyed by the bytes' hash)."""

    def start(self) -> None:
        """Start the media workers (when a model that reads media loads; blocking, not on the loop)."""
        ...

    async def image(self, data: bytes, limits: MediaLimits, preprocess: Any) -> Any: ...

    async def video(self, data: bytes, frames: int, limits: MediaLimits, preprocess: Any) -> Any: ...

    def card(self) -> dict[str, Any]:
        """The card's `media` fields: workers and the decode cache."""
        ...

    async def stop(self) -> None: ...


def _mib(n: int) -> str:
    return f"{n / (1024 * 1024):.1f} MiB"


def check_size(data: bytes, limit: int, what: str) -> None:
    """MediaError unless DATA (an image or a video, WHAT) holds 1..LIMIT bytes."""
    if not data:
        raise MediaError(f"the {what} is empty")
    if len(data) > limit:
        raise MediaError(f"the {what} is {len(data)} bytes ({_mib(len(data))}), over the limit of {limit} bytes")
