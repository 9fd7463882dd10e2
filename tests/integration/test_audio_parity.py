"""The audio family's Whisper encoder embedder (R-PKG-2) against `transformers` (the test-only
reference): FP32 embeddings equal to `WhisperModel`'s encoder states mean-pooled, ≤ 1e-5, for
audio alone and in batches, on features made by our media decoder from generated files; the
fixture writer's package loads in both."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from vllm_srun.adapters.families.audio import audio_limits, read_audio_preprocess
from vllm_srun.adapters.media.audio_features import features
from vllm_srun.adapters.media.audio_samples import audio_bytes, signal
from vllm_srun.adapters.media.decoder import PillowAvDecoder
from vllm_srun.adapters.models.whisper import WhisperEncoderConfig, load_whisper_encoder


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from vllm_srun.adapters.families.fixtures.audio_fixture import write_audio_fixture

    out = tmp_path_factory.mktemp("audio") / "tiny-whisper"
    out.mkdir()
    write_audio_fixture(out, "whisper", seed=3)
    return out


def _reference(folder: Path, batch: np.ndarray) -> np.ndarray:
    from transformers import WhisperModel

    model = WhisperModel.from_pretrained(folder, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        states = model.encoder(torch.from_numpy(batch)).last_hidden_state
    return states.mean(dim=1).numpy()


def test_embeddings_equal_the_reference_alone_and_in_batches(package: Path) -> None:
    spec = read_audio_preprocess(package)
    signals = [
        signal(kind, seconds, spec.sampling_rate, i)
        for i, (kind, seconds) in enumerate(
            [("tone", 0.4), ("noise", 1.9), ("silence", 0.2), ("clipped", 1.0), ("chord", 2.0)]
        )
    ]
    batch = np.stack([features(s, spec) for s in signals])
    want = _reference(package, batch)
    ours = load_whisper_encoder(package)
    with torch.no_grad():
        together = ours.embed_audio(torch.from_numpy(batch)).numpy()
        alone = np.concatenate([ours.embed_audio(torch.from_numpy(row[None])).numpy() for row in batch])
    assert together.shape == (5, 32)
    assert np.abs(together - want).max() < 1e-5
    assert np.abs(alone - want).max() < 1e-5
    assert np.abs(want[0] - want[1]).max() > 1e-2  # different audio, different embeddings


def test_decoded_files_embed_as_their_samples_do(package: Path) -> None:
    """A 16-bit WAV at the model's rate decodes to its samples exactly, so its embedding is the
    reference's on the same samples; other rates and formats decode to nearby features."""
    spec = read_audio_preprocess(package)
    limits = audio_limits({}, spec.seconds)
    decoder = PillowAvDecoder()
    tone = signal("tone", 1.3, spec.sampling_rate, 7)
    pcm = (np.round(np.clip(tone, -1, 32767 / 32768) * 32768) / 32768).astype(np.float32)
    got = decoder.audio(audio_bytes(tone, spec.sampling_rate, "wav"), "wav", limits, spec)
    assert np.array_equal(got, features(pcm, spec))
    want = _reference(package, got[None])
    ours = load_whisper_encoder(package)
    with torch.no_grad():
        assert np.abs(ours.embed_audio(torch.from_numpy(got[None])).numpy() - want).max() < 1e-5


def test_config_refusals() -> None:
    with pytest.raises(ValueError, match="is not whisper"):
        WhisperEncoderConfig.from_dict({"model_type": "clap"})
    with pytest.raises(ValueError, match="not supported"):
        WhisperEncoderConfig.from_dict({"model_type": "whisper", "activation_function": "swish2"})
