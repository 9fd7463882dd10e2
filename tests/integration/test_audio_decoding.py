"""Audio decoding and features (R-MEDIA): log-mel features equal to `transformers`' feature
extractors (numpy reference) ≤ 1e-5 on generated signals (tones, chords, noise, silence,
clipping; many lengths and sample rates); files in every format decode to their samples, mono,
at the model's rate; every kind of bad audio is a one-line `MediaError`."""

from __future__ import annotations

import struct
from fractions import Fraction
from unittest import mock

import av
import numpy as np
import pytest

from vllm_srun.adapters.contracts.media import MediaError, MediaLimits
from vllm_srun.adapters.media.audio import decode_audio
from vllm_srun.adapters.media.audio_features import AudioPreprocess, features
from vllm_srun.adapters.media.audio_samples import KINDS, audio_bytes, pcm16, signal

LIMITS = MediaLimits(max_bytes=16 << 20, max_pixels=0, max_duration_s=10.0)


def _whisper(**cfg: object) -> AudioPreprocess:
    return AudioPreprocess.from_config({"feature_extractor_type": "WhisperFeatureExtractor", **cfg})


@pytest.mark.parametrize("cfg", [{}, {"feature_size": 128}, {"chunk_length": 2, "feature_size": 16}])
def test_whisper_features_equal_the_extractor(cfg: dict[str, int]) -> None:
    from transformers import WhisperFeatureExtractor

    reference, spec = WhisperFeatureExtractor(**cfg), _whisper(**cfg)
    for i, kind in enumerate(KINDS):
        for seconds in (0.01, 0.73, 2.5):  # shorter than the window, and longer (cut)
            samples = signal(kind, seconds, spec.sampling_rate, i)
            window = np.zeros(spec.window_samples, np.float32)
            window[: min(len(samples), spec.window_samples)] = samples[: spec.window_samples]
            want = reference._np_extract_fbank_features(window[None], "cpu")[0]
            got = features(samples, spec)
            assert got.shape == want.shape == spec.output_shape() and got.dtype == np.float32
            assert np.abs(got - want).max() <= 1e-5, (kind, seconds)


CLAP_CONFIGS = [
    {},
    {"truncation": "rand_trunc"},
    {"max_length_s": 1, "sampling_rate": 16000, "hop_length": 160, "fft_window_size": 400, "frequency_max": 8000},
    {"max_length_s": 1, "sampling_rate": 16000, "hop_length": 160, "fft_window_size": 400, "padding": "pad"},
]


@pytest.mark.parametrize("cfg", CLAP_CONFIGS)
def test_clap_features_equal_the_extractor_with_its_crops_made_deterministic(cfg: dict[str, object]) -> None:
    """The extractor crops long audio at random; ours takes the middle of each range, which is
    what the extractor takes with its random picks patched to the middle. Values are dB (about
    -100 … 0): the tolerance is 1e-5 of the value (a float32 rounding)."""
    from transformers import ClapFeatureExtractor

    reference = ClapFeatureExtractor(**cfg)
    spec = AudioPreprocess.from_config({"feature_extractor_type": "ClapFeatureExtractor", **cfg})
    middle = mock.patch("numpy.random.choice", lambda r: r[len(r) // 2])
    randint = mock.patch("numpy.random.randint", lambda a, b=None: (a + b - 1) // 2 if b is not None else 0)
    for i, kind in enumerate(KINDS):
        for seconds in (0.3, 0.999, 2.7):
            samples = signal(kind, seconds, spec.sampling_rate, i)
            with middle, randint:
                want = reference(samples, sampling_rate=spec.sampling_rate, return_tensors="np").input_features[0]
            got = features(samples, spec)
            assert got.shape == want.shape
            assert np.abs(got - want).max() <= 1e-5 * max(1.0, float(np.abs(want).max())), (kind, seconds)


@pytest.mark.parametrize("fmt", ["wav", "flac", "mp3", "ogg"])
@pytest.mark.parametrize("channels", [1, 2])
def test_every_format_decodes_mono_at_the_models_rate(fmt: str, channels: int) -> None:
    rate = 16000
    tone = signal("tone", 1.3, rate, 5)
    got = decode_audio(audio_bytes(tone, rate, fmt, channels), fmt, LIMITS, rate)
    assert got.dtype == np.float32 and got.ndim == 1
    if fmt in ("wav", "flac"):  # lossless: the 16-bit samples, the channels averaged
        assert np.array_equal(got, pcm16(tone))
    else:  # lossy: close to the signal, about as long
        assert abs(len(got) - len(tone)) < rate // 10
        n = min(len(got), len(tone))
        assert np.corrcoef(got[:n], tone[:n])[0, 1] > 0.9


@pytest.mark.parametrize("source", [8000, 22050, 44100, 48000, 96000])
def test_other_rates_are_resampled(source: int) -> None:
    got = decode_audio(audio_bytes(signal("tone", 1.0, source, 1), source, "wav"), "wav", LIMITS, 16000)
    assert abs(len(got) - 16000) <= 16
    assert 0.3 < float(np.abs(got).max()) < 0.6  # the 0.5 tone survives resampling


def _wav_header(rate: int, channels: int = 1, size: int = 0) -> bytes:
    fmt = struct.pack("<HHIIHH", 1, channels, rate, (rate * channels * 2) % 2**32, channels * 2, 16)
    return (
        b"RIFF"
        + struct.pack("<I", 36 + size)
        + b"WAVE"
        + b"fmt "
        + struct.pack("<I", 16)
        + fmt
        + b"data"
        + struct.pack("<I", size)
    )


def _video_only_ogg() -> bytes:
    import io

    buf = io.BytesIO()
    with av.open(buf, "w", format="ogg") as out:
        stream = out.add_stream("libvpx", rate=Fraction(10, 1))
        stream.width = stream.height = 16  # type: ignore[attr-defined]
        for _ in range(3):
            frame = av.VideoFrame.from_ndarray(np.zeros((16, 16, 3), np.uint8), format="rgb24")
            for packet in stream.encode(frame):  # type: ignore[attr-defined]
                out.mux(packet)
        for packet in stream.encode():  # type: ignore[attr-defined]
            out.mux(packet)
    return buf.getvalue()


WAV = audio_bytes(signal("tone", 1.3, 16000, 2), 16000, "wav")
FLAC = audio_bytes(signal("tone", 1.3, 16000, 2), 16000, "flac")
BAD: list[tuple[bytes, str, str]] = [
    (b"", "wav", "the audio is empty"),
    (b"hello world, not audio", "wav", "not audio in a supported format"),
    (FLAC, "wav", "the data is FLAC, not wav as its format says"),
    (WAV, "mp3", "the data is WAV, not mp3"),
    (WAV[:5000], "wav", "truncated"),
    (FLAC[:3000], "flac", "unreadable FLAC file|truncated|corrupt"),
    (b"RIFF\0\0\0\0WAVEfmt " + b"\0" * 64, "wav", "unreadable WAV file"),
    (b"OggS" + bytes(range(256)) * 4, "ogg", "unreadable Ogg file"),
    (_wav_header(16000), "wav", "the audio has no samples"),
    (_wav_header(1, size=200) + b"\0" * 200, "wav", "declares 1 samples per second"),
    (_wav_header(2_000_000_000, size=400) + b"\1" * 400, "wav", "declares 2000000000 samples per second"),
    (_wav_header(16000, channels=200, size=400) + b"\0" * 400, "wav", "declares 200 channels"),
    (audio_bytes(signal("tone", 12, 8000), 8000, "wav"), "wav", "lasts 12.0 s, over the limit of 10 s"),
    (_video_only_ogg(), "ogg", "no audio stream"),
]


@pytest.mark.parametrize(("data", "fmt", "reason"), BAD)
def test_bad_audio_is_a_one_line_media_error(data: bytes, fmt: str, reason: str) -> None:
    with pytest.raises(MediaError, match=reason) as caught:
        decode_audio(data, fmt, LIMITS, 16000)
    assert "\n" not in str(caught.value)


def test_preprocess_configs_that_are_refused() -> None:
    with pytest.raises(ValueError, match="feature_extractor_type"):
        AudioPreprocess.from_config({"feature_extractor_type": "Wav2Vec2FeatureExtractor"})
    with pytest.raises(ValueError, match="dither"):
        _whisper(dither=0.001)
