"""Log-mel features of mono samples, as a package's `preprocessor_config.json` says (numpy only,
so they run in media worker processes).

`AudioPreprocess.from_config(raw)` reads a `WhisperFeatureExtractor` or `ClapFeatureExtractor`
config (keys missing from the file take that extractor's defaults); `features(samples, spec)`
computes what that extractor computes, the steps in its order:

- **whisper**: zero-pad (or cut) to `chunk_length` seconds; a centered STFT (reflect padding,
  periodic Hann window of `n_fft`, hop `hop_length`) in float64; power; Slaney mel filters
  (0 … 8 kHz, Slaney-normalized); log10 of at least 1e-10; the last frame dropped; floor at the
  maximum − 8; `(x + 4) / 4` → float32 [n_mels, chunk_length × rate / hop].
- **clap**: shorter than `max_length_s`: repeated (`repeatpad`) or zero-padded (`pad`) to it;
  the same STFT with `fft_window_size` (its bins kept as complex64, as the extractor does); HTK
  mel filters without normalization (`fusion`) or Slaney ones (`rand_trunc`) over
  `frequency_min` … `frequency_max`; power to dB (10 log10 of at least 1e-10) → float32
  [4, frames, n_mels] for `fusion` (the mel four times), [1, frames, n_mels] for `rand_trunc`.
  Longer audio takes deterministic crops where the extractor takes random ones: `rand_trunc` the
  middle `max_length_s`; `fusion` the middle start of each third of the possible starts, stacked
  behind the whole mel shrunk to the crop's size (bilinear, as torch's `interpolate`).

The reference these are tested against is `transformers`' numpy implementation (float64 STFT);
its torch implementation (float32 STFT, which Whisper's `__call__` takes when torch is
installed) differs from both by up to 3e-5 on pure tones, in bins far below the peak.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

KINDS = {"WhisperFeatureExtractor": "whisper", "ClapFeatureExtractor": "clap"}
_DEFAULTS: dict[str, dict[str, Any]] = {
    "whisper": dict(feature_size=80, sampling_rate=16000, hop_length=160, chunk_length=30, n_fft=400),
    "clap": dict(
        feature_size=64,
        sampling_rate=48000,
        hop_length=480,
        max_length_s=10,
        fft_window_size=1024,
        frequency_min=0.0,
        frequency_max=14000.0,
        truncation="fusion",
        padding="repeatpad",
    ),
}


@dataclass(frozen=True)
class AudioPreprocess:
    """What `preprocessor_config.json` asks for, checked (picklable: it crosses into media workers)."""

    kind: str  # whisper | clap
    sampling_rate: int
    n_mels: int
    n_fft: int
    hop_length: int
    window_samples: int  # the model's window: whisper pads or cuts to it, clap repeats or crops
    f_min: float = 0.0
    f_max: float = 8000.0
    truncation: str = "fusion"  # clap
    padding: str = "repeatpad"  # clap

    @classmethod
    def from_config(cls, raw: dict[str, Any]) -> AudioPreprocess:
        named = str(raw.get("feature_extractor_type") or "")
        kind = KINDS.get(named)
        if kind is None:
            raise ValueError(f"preprocessor_config.json feature_extractor_type {named!r} is not one of {sorted(KINDS)}")
        c = {**_DEFAULTS[kind], **{k: v for k, v in raw.items() if k in _DEFAULTS[kind]}}
        rate = int(c["sampling_rate"])
        if kind == "whisper":
            if raw.get("dither"):
                raise ValueError("preprocessor_config.json sets dither (random noise): not supported")
            spec = cls(
                kind, rate, int(c["feature_size"]), int(c["n_fft"]), int(c["hop_length"]), int(c["chunk_length"]) * rate
            )
        else:
            if c["truncation"] not in ("fusion", "rand_trunc") or c["padding"] not in ("repeatpad", "repeat", "pad"):
                raise ValueError(f"preprocessor_config.json truncation {c['truncation']!r} / padding {c['padding']!r}")
            if raw.get("top_db") is not None:
                raise ValueError("preprocessor_config.json sets top_db: not supported")
            spec = cls(
                kind,
                rate,
                int(c["feature_size"]),
                int(c["fft_window_size"]),
                int(c["hop_length"]),
                int(c["max_length_s"]) * rate,
                float(c["frequency_min"]),
                float(c["frequency_max"]),
                str(c["truncation"]),
                str(c["padding"]),
            )
        if min(spec.sampling_rate, spec.n_mels, spec.n_fft, spec.hop_length, spec.window_samples) < 1:
            raise ValueError("preprocessor_config.json: sizes and rates must be positive")
        return spec

    @property
    def seconds(self) -> float:
        return self.window_samples / self.sampling_rate

    @property
    def frames(self) -> int:
        """Spectrogram frames of one window."""
        frames = 1 + self.window_samples // self.hop_length
        return frames - 1 if self.kind == "whisper" else frames

    def output_shape(self) -> tuple[int, ...]:
        if self.kind == "whisper":
            return (self.n_mels, self.frames)
        return (4 if self.truncation == "fusion" else 1, self.frames, self.n_mels)


# ---- mel filters (Hz ↔ mel on the HTK or Slaney scale, triangles in Hz) ----------------------
def hz_to_mel(hz: np.ndarray, scale: str) -> np.ndarray:
    if scale == "htk":
        return 2595.0 * np.log10(1.0 + hz / 700.0)
    mels = 3.0 * hz / 200.0
    above = hz >= 1000.0
    return np.where(above, 15.0 + np.log(np.maximum(hz, 1e-12) / 1000.0) * (27.0 / np.log(6.4)), mels)


def mel_to_hz(mels: np.ndarray, scale: str) -> np.ndarray:
    if scale == "htk":
        return 700.0 * (10.0 ** (mels / 2595.0) - 1.0)
    hz = 200.0 * mels / 3.0
    return np.where(mels >= 15.0, 1000.0 * np.exp((mels - 15.0) * (np.log(6.4) / 27.0)), hz)


@functools.lru_cache(maxsize=16)
def mel_filters(
    bins: int, mels: int, f_min: float, f_max: float, rate: int, scale: str, slaney_norm: bool
) -> np.ndarray:
    """[bins, mels] float64 triangular filters."""
    edges = mel_to_hz(
        np.linspace(hz_to_mel(np.array(f_min), scale), hz_to_mel(np.array(f_max), scale), mels + 2), scale
    )
    fft_hz = np.linspace(0, rate // 2, bins)
    widths = np.diff(edges)
    slopes = edges[None, :] - fft_hz[:, None]
    rising, falling = -slopes[:, :-2] / widths[:-1], slopes[:, 2:] / widths[1:]
    filters = np.maximum(0.0, np.minimum(rising, falling))
    if slaney_norm:
        filters = filters * (2.0 / (edges[2 : mels + 2] - edges[:mels]))[None, :]
    filters.setflags(write=False)
    return filters


def _power(samples: np.ndarray, n_fft: int, hop: int, complex64: bool) -> np.ndarray:
    """[frames, n_fft // 2 + 1] float64 power of a centered STFT with a periodic Hann window."""
    x = np.pad(samples.astype(np.float64), n_fft // 2, mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(x, n_fft)[::hop]
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)
    spectrum = np.fft.rfft(frames * window, axis=1)
    if complex64:
        spectrum = spectrum.astype(np.complex64)
    return np.abs(spectrum, dtype=np.float64) ** 2


def whisper_features(samples: np.ndarray, spec: AudioPreprocess) -> np.ndarray:
    x = np.zeros(spec.window_samples, dtype=np.float32)
    x[: min(len(samples), spec.window_samples)] = samples[: spec.window_samples]
    filters = mel_filters(spec.n_fft // 2 + 1, spec.n_mels, 0.0, 8000.0, spec.sampling_rate, "slaney", True)
    mel = filters.T @ _power(x, spec.n_fft, spec.hop_length, False).T
    log = np.log10(np.maximum(mel, 1e-10))[:, :-1]
    log = np.maximum(log, log.max() - 8.0)
    return ((log + 4.0) / 4.0).astype(np.float32)


def _clap_mel(samples: np.ndarray, spec: AudioPreprocess, fusion: bool) -> np.ndarray:
    """[frames, n_mels] float64 dB."""
    bins = spec.n_fft // 2 + 1
    if fusion:
        filters = mel_filters(bins, spec.n_mels, spec.f_min, spec.f_max, spec.sampling_rate, "htk", False)
    else:
        filters = mel_filters(bins, spec.n_mels, spec.f_min, spec.f_max, spec.sampling_rate, "slaney", True)
    mel = np.maximum(1e-10, filters.T @ _power(samples, spec.n_fft, spec.hop_length, True).T)
    return (10.0 * np.log10(np.maximum(mel, 1e-10))).astype(np.float32).T


def shrink(mel: np.ndarray, rows: int) -> np.ndarray:
    """MEL [frames, n] float32 resized to [rows, n]: bilinear with half-pixel centers, computed in
    float32 as torch's `interpolate(align_corners=False)` computes it (columns keep their size)."""
    f32 = np.float32
    frames = mel.shape[0]
    scale = f32(frames) / f32(rows)
    src = np.maximum(scale * (np.arange(rows, dtype=f32) + f32(0.5)) - f32(0.5), f32(0))
    low = src.astype(np.int64)
    high = np.where(low < frames - 1, low + 1, low)
    up = np.clip(src - low.astype(f32), f32(0), f32(1))[:, None]
    down = f32(1) - up
    return (down * mel[low] + up * mel[high]).astype(f32)


def clap_features(samples: np.ndarray, spec: AudioPreprocess) -> np.ndarray:
    window, fusion = spec.window_samples, spec.truncation == "fusion"
    x = samples.astype(np.float64)
    if len(x) > window:
        if not fusion:
            start = (len(x) - window) // 2
            return _clap_mel(x[start : start + window], spec, False)[None]
        mel = _clap_mel(x, spec, True)
        chunk = window // spec.hop_length + 1
        if chunk == mel.shape[0]:
            return np.stack([mel] * 4)
        thirds = np.array_split(np.arange(mel.shape[0] - chunk + 1), 3)
        starts = [int(t[len(t) // 2]) if len(t) else 0 for t in thirds]
        return np.stack([shrink(mel, chunk), *(mel[s : s + chunk] for s in starts)])
    if len(x) < window:
        if spec.padding == "repeat":
            x = np.tile(x, window // len(x) + 1)[:window]
        elif spec.padding == "repeatpad":
            x = np.tile(x, window // len(x))
        x = np.pad(x, (0, window - len(x)))
    mel = _clap_mel(x, spec, fusion)
    return np.stack([mel] * 4) if fusion else mel[None]


def features(samples: np.ndarray, spec: AudioPreprocess) -> np.ndarray:
    """The float32 features SPEC's extractor makes of SAMPLES (mono, at its rate)."""
    if spec.kind == "whisper":
        return whisper_features(samples, spec)
    return clap_features(samples, spec)


def longer(samples: int, spec: AudioPreprocess) -> bool:
    """Whether audio of SAMPLES is longer than the window (CLAP's `is_longer`)."""
    return samples > spec.window_samples
