"""Videos with PyAV: sniff the container, check the limits, decode, sample frames uniformly over
the duration (`domain/inputs/media.py`), preprocess each sample like an image.

- Containers: MP4/MOV, Matroska/WebM, AVI, GIF and MPEG-TS, recognised from their first bytes
  and opened with that demuxer only (never a playlist or anything that names other files).
- Before any frame is decoded: the byte size, a video stream (`no video stream` otherwise), the
  frame size and the duration from the header (when the header has none, a first pass counts
  the frames); while decoding: the number of frames decoded and each frame's size.
- Samples: the middles of N equal slices of the duration; each takes the frame shown at that
  instant. Frames are decoded in order (up to the last sample) and only the picked ones are
  converted to RGB. Frames that stop before three quarters of the duration the header declares
  are refused as a truncated file. Rotation metadata is not applied.
- N is the request's (`sample_video`), or decided from the duration (`sample_clip`, for a
  vision-language model's processor, which also gets each sample's time).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from typing import Any

import av
import numpy as np
from PIL import Image

from vllm_srun.adapters.contracts.media import MediaError, MediaLimits
from vllm_srun.domain.inputs.media import FramePicker, sample_times

CONTAINERS = "MP4/MOV, Matroska/WebM, AVI, GIF, MPEG-TS"
CONTAINER_NAMES = {"mov": "MP4/MOV", "matroska": "Matroska/WebM", "avi": "AVI", "gif": "GIF", "mpegts": "MPEG-TS"}
TRUNCATED = 0.75  # frames that stop before this share of the declared duration: a truncated file
ToPixels = Callable[[Image.Image], np.ndarray]
FramePixels = Callable[[Image.Image, int], np.ndarray]  # (a sampled frame, how many are sampled) → pixels


def container_format(data: bytes, formats: tuple[str, ...] = ()) -> str:
    """The demuxer for DATA, from its first bytes; MediaError when it is no container we read, or
    not one of FORMATS (demuxer names; empty: any)."""
    head = data[:16]
    found = None
    if head[4:8] in (b"ftyp", b"moov", b"mdat", b"free", b"wide", b"skip"):
        found = "mov"
    elif head.startswith(b"\x1a\x45\xdf\xa3"):
        found = "matroska"
    elif head.startswith(b"RIFF") and head[8:12] == b"AVI ":
        found = "avi"
    elif head.startswith((b"GIF87a", b"GIF89a")):
        found = "gif"
    elif len(data) > 376 and data[0] == 0x47 and data[188] == 0x47 and data[376] == 0x47:
        found = "mpegts"
    read = ", ".join(CONTAINER_NAMES[f] for f in formats) if formats else CONTAINERS
    if found is None:
        raise MediaError(f"not a video in a supported container ({read})")
    if formats and found not in formats:
        raise MediaError(f"a {CONTAINER_NAMES[found]} video, and this model reads {read} only")
    return found


def _open(data: bytes, fmt: str) -> Any:
    try:
        return av.open(io.BytesIO(data), mode="r", format=fmt, metadata_errors="ignore")
    except Exception as exc:  # any demuxer error on hostile bytes is the input's fault
        raise MediaError(f"unreadable {fmt} container ({_reason(exc)})") from None


def _reason(exc: BaseException) -> str:
    """FFmpeg's words for what went wrong, without its error number and file name."""
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return str(text).splitlines()[0][:120]


def _frames(container: Any, stream: Any, limits: MediaLimits) -> Iterator[tuple[float, Any]]:
    """(start time in seconds, frame) in decode order, within the limits."""
    rate = stream.average_rate or stream.guessed_rate
    step = 1.0 / float(rate) if rate else 1.0 / 30
    count = 0
    try:
        for frame in container.decode(stream):
            count += 1
            if limits.max_decoded_frames and count > limits.max_decoded_frames:
                raise MediaError(f"the video has more than {limits.max_decoded_frames} frames")
            if frame.width * frame.height > limits.max_pixels:
                raise MediaError(
                    f"a video frame is {frame.width}×{frame.height} pixels, over the limit of {limits.max_pixels}"
                )
            yield (float(frame.time) if frame.time is not None else (count - 1) * step), frame
    except MediaError:
        raise
    except Exception as exc:
        raise MediaError(f"corrupt video data after {count} frames ({_reason(exc)})") from None


def _header(container: Any, stream: Any, limits: MediaLimits) -> float | None:
    """Checks what the header says; returns the duration in seconds (None: not declared)."""
    width, height = stream.codec_context.width, stream.codec_context.height
    if width * height > limits.max_pixels:
        raise MediaError(
            f"video frames are {width}×{height} = {width * height} pixels, over the limit of {limits.max_pixels}"
        )
    duration = None
    if stream.duration and stream.time_base:
        duration = float(stream.duration * stream.time_base)
    elif container.duration:
        duration = container.duration / av.time_base
    if duration is not None and limits.max_duration_s and duration > limits.max_duration_s:
        raise MediaError(f"the video lasts {duration:.1f} s, over the limit of {limits.max_duration_s:g} s")
    return duration if duration and duration > 0 else None


def _measure(data: bytes, fmt: str, limits: MediaLimits) -> tuple[float, float]:
    """(start, duration) of a video whose header declares none, from a first pass over its frames."""
    with _open(data, fmt) as container:
        stream = container.streams.video[0]
        times = [t for t, _ in _frames(container, stream, limits)]
    if not times:
        raise MediaError("the video has no frames")
    step = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else 1.0 / 30
    duration = times[-1] - times[0] + step
    if limits.max_duration_s and duration > limits.max_duration_s:
        raise MediaError(f"the video lasts {duration:.1f} s, over the limit of {limits.max_duration_s:g} s")
    return times[0], duration


def sample_video(data: bytes, frames: int, limits: MediaLimits, to_pixels: ToPixels) -> np.ndarray:
    """FRAMES preprocessed frames, [FRAMES, 3, H, W] float32."""
    limits.check_bytes(data, "video")
    if limits.max_frames and not 1 <= frames <= limits.max_frames:
        raise MediaError(f"frames must be between 1 and {limits.max_frames} (got {frames})")
    pixels, _ = sample_clip(data, lambda _: frames, limits, lambda image, _: to_pixels(image))
    return pixels


def sample_clip(
    data: bytes, frames_for: Callable[[float], int], limits: MediaLimits, to_pixels: FramePixels
) -> tuple[np.ndarray, tuple[float, ...]]:
    """The preprocessed frames, [N, 3, H, W] float32, N = FRAMES_FOR(the duration in seconds), and
    each sample's time: the start of the frame it took, in seconds from the first frame."""
    limits.check_bytes(data, "video")
    fmt = container_format(data, limits.formats)
    with _open(data, fmt) as container:
        if not container.streams.video:
            raise MediaError("the file has no video stream")
        stream = container.streams.video[0]
        duration = _header(container, stream, limits)
    start: float | None = None
    if duration is None:
        start, duration = _measure(data, fmt, limits)
    frames = frames_for(duration)
    if frames < 1 or (limits.max_frames and frames > limits.max_frames):
        raise MediaError(f"frames must be between 1 and {limits.max_frames or frames} (got {frames})")
    picked: list[np.ndarray | None] = [None] * frames
    times = [0.0] * frames
    with _open(data, fmt) as container:
        stream = container.streams.video[0]
        picker: FramePicker | None = None
        origin = first_time = last_time = 0.0
        last: Any = None
        count = 0
        for time, frame in _frames(container, stream, limits):
            if picker is None:  # the slices start at the first frame (or the measured start)
                first_time = time
                origin = time if start is None else start
                picker = FramePicker(sample_times(origin, duration, frames))
            served = picker.offer(time)
            if served:  # the frame before this one is shown at these instants (the first frame: itself)
                converted = to_pixels((frame if last is None else last).to_image(), frames)
                shown = (time if last is None else last_time) - first_time
                for i in served:
                    picked[i], times[i] = converted, shown
            last_time, last = time, frame
            count += 1
            if picker.done:
                break
        if picker is None or last is None:
            raise MediaError("the video has no frames")
        rest = picker.finish()
        if rest:
            step = (last_time - first_time) / (count - 1) if count > 1 else duration
            if last_time + step < origin + TRUNCATED * duration:
                raise MediaError(
                    f"the video stops after {last_time + step - first_time:.2f} s of the {duration:.2f} s "
                    "its header declares (truncated)"
                )
            converted = to_pixels(last.to_image(), frames)
            for i in rest:
                picked[i], times[i] = converted, last_time - first_time
    return np.stack([p for p in picked if p is not None]), tuple(times)
