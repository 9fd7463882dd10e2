"""Audio made in code (numpy signals, PyAV encoders), deterministic by seed: the audio of fixture
golden files, tests and benchmarks. Nothing is ever downloaded.

`signal(kind, seconds, rate)` makes a tone, a chord, noise, silence or a clipped tone in [-1, 1];
`audio_bytes(samples, rate, fmt)` encodes it as WAV (16-bit PCM), FLAC, MP3 or Ogg Opus, mono
or with CHANNELS copies; `input_audio(...)` is the request item.
"""

from __future__ import annotations

import base64
import io
from typing import Any

import numpy as np

# format → (muxer, encoder, sample format); Ogg holds Opus (rates of 8, 12, 16, 24 or 48 kHz)
CODECS = {
    "wav": ("wav", "pcm_s16le", "s16"),
    "flac": ("flac", "flac", "s16"),
    "mp3": ("mp3", "libmp3lame", "fltp"),
    "ogg": ("ogg", "libopus", "flt"),
}
KINDS = ("tone", "chord", "noise", "silence", "clipped")


def signal(kind: str, seconds: float, rate: int, seed: int = 0) -> np.ndarray:
    """float32 [round(seconds × rate)] in [-1, 1]."""
    n = round(seconds * rate)
    t = np.arange(n, dtype=np.float64) / rate
    rng = np.random.default_rng(seed)
    if kind == "tone":
        out = 0.5 * np.sin(2 * np.pi * rng.uniform(110, min(2000, rate / 4)) * t)
    elif kind == "chord":
        out = sum(0.2 * np.sin(2 * np.pi * f * t + rng.uniform(0, 6)) for f in rng.uniform(80, rate / 3, 4))
    elif kind == "noise":
        out = rng.normal(0, 0.2, n)
    elif kind == "silence":
        out = np.zeros(n)
    elif kind == "clipped":
        out = np.clip(3.0 * np.sin(2 * np.pi * rng.uniform(60, 400) * t), -1.0, 1.0)
    else:
        raise ValueError(f"unknown signal {kind!r} (known: {', '.join(KINDS)})")
    return np.clip(out, -1.0, 1.0).astype(np.float32)


def audio_bytes(samples: np.ndarray, rate: int, fmt: str = "wav", channels: int = 1) -> bytes:
    """SAMPLES (float32 mono) encoded as FMT at RATE, repeated on CHANNELS channels."""
    import av
    from av.audio.stream import AudioStream

    container, codec, sample_format = _codec(fmt)
    layout = {1: "mono", 2: "stereo"}.get(channels, f"{channels}c")
    buf = io.BytesIO()
    with av.open(buf, mode="w", format=container) as out:
        stream = out.add_stream(codec, rate=rate)
        assert isinstance(stream, AudioStream)
        stream.layout = layout
        stream.format = sample_format
        stream.codec_context.thread_count = 1
        size = stream.codec_context.frame_size or (rate // 50 if codec == "libopus" else 1024)
        for start in range(0, len(samples), size):
            for packet in stream.encode(_frame(samples[start : start + size], rate, sample_format, layout, channels)):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


def _codec(fmt: str) -> tuple[str, str, str]:
    if fmt not in CODECS:
        raise ValueError(f"no encoder for {fmt!r} (known: {', '.join(CODECS)})")
    return CODECS[fmt]


def _frame(chunk: np.ndarray, rate: int, sample_format: str, layout: str, channels: int) -> Any:
    import av

    if sample_format in ("s16", "flt"):
        pcm = pcm16(chunk, np.int16) if sample_format == "s16" else chunk.astype(np.float32)
        array = np.repeat(pcm[None, :], channels, axis=0).T.reshape(1, -1)  # packed: interleaved
    else:
        array = np.repeat(chunk.astype(np.float32)[None, :], channels, axis=0)  # planar
    frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(array), format=sample_format, layout=layout)
    frame.sample_rate = rate
    return frame


def pcm16(samples: np.ndarray, dtype: Any = np.float32) -> np.ndarray:
    """What 16-bit PCM keeps of SAMPLES: as float32 read back (/ 32768), or the int16 values."""
    values = np.round(np.clip(samples, -1.0, 32767 / 32768) * 32768)
    return values.astype(np.int16) if dtype == np.int16 else (values / 32768).astype(np.float32)


def input_audio(data: bytes, fmt: str) -> dict[str, Any]:
    """The `/v1/embeddings` item for DATA."""
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode("ascii"), "format": fmt}}


def audio_item(kind: str, seconds: float, rate: int, fmt: str = "wav", seed: int = 0) -> dict[str, Any]:
    """A generated signal as a request item."""
    return input_audio(audio_bytes(signal(kind, seconds, rate, seed), rate, fmt), fmt)
