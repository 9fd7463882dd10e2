"""What the audio family's two kinds of package (Whisper encoders, `audio.py`; CLAP,
`audio_clap.py`) share: the audio lane and its CPU cap, the limits of one audio input (defaults
lowered by srun.json, never over the model's window), reading `preprocessor_config.json`, the
features of generated signals (warm-up and probe rows) and the card's `media` object.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vllm_srun.adapters.contracts import MediaLimits
from vllm_srun.adapters.media.audio_features import AudioPreprocess
from vllm_srun.domain.inputs import media

AUDIO_LANE = "audio"
PREPROCESSOR = "preprocessor_config.json"
GOLDEN_FILE = "golden.json"
# R-BAT-7 cap on a CPU, in padded tokens: a few windows per forward (at least one), so that a
# text request of another model's lane is never queued behind a long round of audio
CPU_AUDIO_CAP_TOKENS = 3072


def _limit(manifest: dict[str, Any], key: str, default: float) -> Any:
    """A limit from srun.json's `media` object: it may lower the default, never raise it."""
    value = (manifest.get("media") or {}).get(key, default)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value <= default:
        raise ValueError(f"srun.json media.{key} must be a number in (0, {default:g}] (got {value!r})")
    return type(default)(value)


def audio_limits(manifest: dict[str, Any], window_seconds: float) -> MediaLimits:
    """Bytes and seconds of one audio input: the defaults, lowered by srun.json, the seconds
    never over the model's window."""
    return MediaLimits(
        max_bytes=_limit(manifest, "max_audio_bytes", media.AUDIO_MAX_BYTES),
        max_pixels=0,
        max_duration_s=min(_limit(manifest, "max_audio_seconds", media.AUDIO_MAX_SECONDS), window_seconds),
    )


def sample_features(spec: AudioPreprocess, seconds: Sequence[float]) -> list[np.ndarray]:
    """SPEC's features of generated signals of SECONDS (warm-up and probe rows)."""
    from vllm_srun.adapters.media.audio_features import features
    from vllm_srun.adapters.media.audio_samples import KINDS as SIGNALS
    from vllm_srun.adapters.media.audio_samples import signal

    rate = spec.sampling_rate
    return [features(signal(SIGNALS[i % len(SIGNALS)], s, rate, i), spec) for i, s in enumerate(seconds)]


def read_audio_preprocess(folder: Path) -> AudioPreprocess:
    path = Path(folder) / PREPROCESSOR
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"no {PREPROCESSOR} in {Path(folder).name}: how audio becomes features is unknown") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return AudioPreprocess.from_config(raw)


def media_card(spec: AudioPreprocess, limits: MediaLimits, audio_tokens: int) -> dict[str, Any]:
    """The card's `media` object of an audio model: its lane, limits and feature settings."""
    preprocess: dict[str, Any] = {
        "features": f"{spec.kind} log-mel",
        "sampling_rate": spec.sampling_rate,
        "mono": "channels averaged",
        "n_mels": spec.n_mels,
        "n_fft": spec.n_fft,
        "hop_length": spec.hop_length,
        "window_seconds": spec.seconds,
    }
    if spec.kind == "clap":
        preprocess |= {"padding": spec.padding, "truncation": spec.truncation, "f_min": spec.f_min, "f_max": spec.f_max}
    return {
        "lane": AUDIO_LANE,
        "audio_tokens": audio_tokens,
        "audio": {
            "formats": list(media.AUDIO_FORMATS),
            "max_bytes": limits.max_bytes,
            "max_seconds": limits.max_duration_s,
            "sample_rates": [media.AUDIO_MIN_RATE, media.AUDIO_MAX_RATE],
            "max_channels": media.AUDIO_MAX_CHANNELS,
        },
        "preprocess": preprocess,
    }
