"""Audio with PyAV (R-MEDIA): sniff the format, hold it to the one the request declares, check
the limits, decode to mono float32 samples at the model's rate.

- Formats: WAV, FLAC, MP3 and Ogg (Vorbis, Opus, FLAC), recognised from their first bytes
  (`domain/inputs/media.audio_format`) and opened with that demuxer only. Bytes of another format than
  the request's `format` are refused (`the data is FLAC, not wav as its format says`).
- Before any sample is decoded: the byte size, an audio stream (`no audio stream` otherwise), the
  sample rate (1 kHz … 384 kHz) and channel count (at most 32) the header declares, and the
  duration it declares; while decoding: the samples decoded so far against the duration limit.
- Resampled to the model's rate with FFmpeg's resampler, then the channels averaged into one; a
  file already at that rate passes through unchanged (16-bit PCM becomes `value / 32768`).
- A file whose samples stop before three quarters of the duration its header declares (a WAV
  file: before the end of its `data` chunk) is refused as truncated; one with no samples at all
  as empty.
"""

from __future__ import annotations

import io
import struct
from typing import Any

import av
import numpy as np

from vllm_srun.adapters.contracts.media import MediaError, MediaLimits
from vllm_srun.domain.inputs.media import (
    AUDIO_FORMATS,
    AUDIO_MAX_CHANNELS,
    AUDIO_MAX_RATE,
    AUDIO_MIN_RATE,
    audio_format,
)

NAMES = {"wav": "WAV", "flac": "FLAC", "mp3": "MP3", "ogg": "Ogg"}
TRUNCATED = 0.75  # samples that stop before this share of the declared duration: a truncated file


def _reason(exc: BaseException) -> str:
    """FFmpeg's words for what went wrong, without its error number and file name."""
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return str(text).splitlines()[0][:120]


def _open(data: bytes, fmt: str) -> Any:
    try:
        return av.open(io.BytesIO(data), mode="r", format=fmt, metadata_errors="ignore")
    except Exception as exc:  # any demuxer error on hostile bytes is the input's fault
        raise MediaError(f"unreadable {NAMES[fmt]} file ({_reason(exc)})") from None


def check_format(data: bytes, fmt: str) -> str:
    """The demuxer for DATA: the format its first bytes claim, which must be FMT."""
    found = audio_format(data[:16])
    if found is None:
        raise MediaError(f"not audio in a supported format ({', '.join(AUDIO_FORMATS)})")
    if found != fmt:
        raise MediaError(f"the data is {NAMES[found]}, not {fmt} as its format says")
    return found


def _header(container: Any, stream: Any, limits: MediaLimits) -> float | None:
    """Checks what the header says; returns the duration in seconds (None: not declared)."""
    codec = stream.codec_context
    rate = int(codec.sample_rate or stream.rate or 0)
    if not AUDIO_MIN_RATE <= rate <= AUDIO_MAX_RATE:
        raise MediaError(f"the audio declares {rate} samples per second (read: {AUDIO_MIN_RATE} to {AUDIO_MAX_RATE})")
    channels = int(getattr(codec, "channels", 0) or len(codec.layout.channels))
    if not 1 <= channels <= AUDIO_MAX_CHANNELS:
        raise MediaError(f"the audio declares {channels} channels (read: 1 to {AUDIO_MAX_CHANNELS})")
    duration = None
    if stream.duration and stream.time_base:
        duration = float(stream.duration * stream.time_base)
    elif container.duration:
        duration = container.duration / av.time_base
    if duration is not None and limits.max_duration_s and duration > limits.max_duration_s:
        raise MediaError(f"the audio lasts {duration:.1f} s, over the limit of {limits.max_duration_s:g} s")
    return duration if duration and duration > 0 else None


def _mono(frame: Any) -> np.ndarray:
    """A planar float frame's channels averaged: float32 [samples]."""
    planes = frame.to_ndarray()
    return planes[0] if planes.shape[0] == 1 else planes.mean(axis=0, dtype=np.float64).astype(np.float32)


def _samples(container: Any, stream: Any, limits: MediaLimits, rate: int) -> np.ndarray:
    """Every sample, mono float32 at RATE, within the duration limit."""
    resampler = av.AudioResampler(format="fltp", rate=rate)  # planar float, the file's own channels
    most = int(limits.max_duration_s * rate) + rate // 10 if limits.max_duration_s else None  # 0.1 s of slack
    parts: list[np.ndarray] = []
    count = 0
    try:
        for frame in container.decode(stream):
            frame.pts = None  # the resampler reads no timestamps: gaps and overlaps are not ours to fix
            for out in resampler.resample(frame):
                part = _mono(out)
                parts.append(part)
                count += part.size
            if most is not None and count > most:
                raise MediaError(f"the audio lasts more than {limits.max_duration_s:g} s (the limit)")
        for out in resampler.resample(None):
            part = _mono(out)
            parts.append(part)
            count += part.size
    except MediaError:
        raise
    except Exception as exc:
        raise MediaError(f"corrupt audio data after {count / rate:.2f} s ({_reason(exc)})") from None
    if most is not None and count > most:
        raise MediaError(f"the audio lasts more than {limits.max_duration_s:g} s (the limit)")
    return np.concatenate(parts).astype(np.float32, copy=False) if parts else np.zeros(0, np.float32)


def _wav_data_missing(data: bytes) -> int:
    """Bytes a WAV file's `data` chunk declares beyond the end of the file (0: none, or no chunk
    found; FFmpeg reads what is there without a word, so a cut file is found here)."""
    at = 12
    while at + 8 <= len(data):
        kind, size = data[at : at + 4], struct.unpack("<I", data[at + 4 : at + 8])[0]
        if kind == b"data":
            return 0 if size == 0xFFFFFFFF else max(0, at + 8 + size - len(data))  # 0xFFFFFFFF: streamed
        at += 8 + size + (size & 1)
    return 0


def decode_audio(data: bytes, fmt: str, limits: MediaLimits, rate: int) -> np.ndarray:
    """DATA (declared FMT) → float32 [samples], mono, at RATE samples per second."""
    limits.check_bytes(data, "audio")
    demuxer = check_format(data, fmt)
    if demuxer == "wav" and (missing := _wav_data_missing(data)):
        raise MediaError(f"the WAV file ends {missing} bytes before the end of its data chunk (truncated)")
    with _open(data, demuxer) as container:
        if not container.streams.audio:
            raise MediaError("the file has no audio stream")
        stream = container.streams.audio[0]
        declared = _header(container, stream, limits)
        samples = _samples(container, stream, limits, rate)
    if samples.size == 0:
        raise MediaError("the audio has no samples")
    if not np.isfinite(samples).all():
        raise MediaError("the audio has samples that are not finite numbers")
    seconds = samples.size / rate
    if declared is not None and seconds < TRUNCATED * declared:
        raise MediaError(
            f"the audio stops after {seconds:.2f} s of the {declared:.2f} s its header declares (truncated)"
        )
    return samples
