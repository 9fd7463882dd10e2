"""CLAP (R-PKG-2) against `transformers` (the test-only reference): FP32 text and audio embeddings
equal to `ClapModel.get_text_features` / `get_audio_features` within 1e-5, alone and in batches,
with the tokenizer's ids and the feature extractor's features equal to ours; the fixture writer's
package and a package `transformers` writes itself (other sizes, windows that need padding) both
load; fused models and configs our HTSAT cannot read are refused in one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from vllm_srun.adapters.families.audio import read_audio_preprocess
from vllm_srun.adapters.media.audio_features import features
from vllm_srun.adapters.media.audio_samples import signal
from vllm_srun.adapters.models.clap import load_clap
from vllm_srun.adapters.models.clap_config import ClapConfig
from vllm_srun.adapters.models.tokenization import TextTokenizer

TEXTS = [
    "the sound of a dog barking",
    "rain",
    "Piano music, LOUD!  and a quiet car engine…",
    "café crème 42",
    "a",
]
SIGNALS = [("tone", 0.4), ("noise", 1.9), ("silence", 0.2), ("clipped", 1.0), ("chord", 2.0)]


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from vllm_srun.adapters.families.fixtures.audio_fixture import write_audio_fixture

    out = tmp_path_factory.mktemp("clap") / "tiny-clap"
    out.mkdir()
    write_audio_fixture(out, "clap", seed=5)
    return out


def _pooled(out: Any) -> np.ndarray:
    pooled = out.pooler_output if hasattr(out, "pooler_output") else out
    return np.asarray(pooled.numpy())


def _reference(folder: Path) -> Any:
    from transformers import ClapModel

    model, info = ClapModel.from_pretrained(folder, torch_dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    return model.eval()


def _signals(rate: int) -> list[np.ndarray]:
    return [signal(kind, seconds, rate, i) for i, (kind, seconds) in enumerate(SIGNALS)]


def test_audio_embeddings_equal_the_reference_alone_and_in_batches(package: Path) -> None:
    from transformers import ClapFeatureExtractor

    spec = read_audio_preprocess(package)
    signals = _signals(spec.sampling_rate)
    batch = np.stack([features(s, spec) for s in signals])
    extractor = ClapFeatureExtractor.from_pretrained(package)
    theirs = extractor(signals, sampling_rate=spec.sampling_rate, return_tensors="np").input_features
    assert batch.shape == theirs.shape == (5, 1, 201, 16)
    assert np.abs(batch - theirs).max() <= 1e-5 * np.abs(theirs).max()
    with torch.no_grad():
        want = _pooled(_reference(package).get_audio_features(input_features=torch.from_numpy(batch)))
        ours = load_clap(package)
        together = ours.embed_audio(torch.from_numpy(batch)).numpy()
        alone = np.concatenate([ours.embed_audio(torch.from_numpy(row[None])).numpy() for row in batch])
    assert together.shape == (5, 16)
    assert np.abs(together - want).max() < 1e-5
    assert np.abs(alone - want).max() < 1e-5
    assert np.allclose(np.linalg.norm(together, axis=1), 1.0, atol=1e-6)
    assert np.abs(want[0] - want[1]).max() > 1e-2  # different audio, different embeddings


def test_text_embeddings_and_ids_equal_the_reference_alone_and_in_batches(package: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(package)
    enc = tokenizer(TEXTS, padding=True, return_tensors="pt")
    rows = [e.ids for e in TextTokenizer.from_folder(package).encode(TEXTS)]
    theirs = [
        [i for i, m in zip(ids, mask, strict=True) if m]
        for ids, mask in zip(enc.input_ids.tolist(), enc.attention_mask.tolist(), strict=True)
    ]
    assert rows == theirs
    assert len({len(r) for r in rows}) > 2  # the batch pads
    with torch.no_grad():
        want = _pooled(_reference(package).get_text_features(**enc))
        ours = load_clap(package)
        together = ours.embed_text(rows).numpy()
        alone = np.concatenate([ours.embed_text([r]).numpy() for r in rows])
    assert together.shape == (5, 16)
    assert np.abs(together - want).max() < 1e-5
    assert np.abs(alone - want).max() < 1e-5
    assert np.abs(want[0] - want[1]).max() > 1e-2


def _perturbed_package(folder: Path, seed: int) -> None:
    """A ClapModel transformers builds and saves itself, every parameter and norm statistic
    redrawn (its own init leaves the position-bias tables at zero)."""
    from transformers import ClapAudioConfig, ClapConfig, ClapModel, ClapTextConfig

    text = ClapTextConfig(
        vocab_size=60,
        hidden_size=24,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=40,
        max_position_embeddings=20,
        layer_norm_eps=1e-5,
    )
    audio = ClapAudioConfig(
        window_size=3,  # grids of 16, 8 and 4 positions: every stage pads to whole windows
        num_mel_bins=16,
        spec_size=64,
        patch_size=4,
        patch_stride=4,
        hidden_size=48,
        depths=[2, 1, 2],
        num_attention_heads=[3, 3, 6],
        patch_embeds_hidden_size=12,
        mlp_ratio=1.5,
    )
    torch.manual_seed(seed)
    model = ClapModel(ClapConfig(text_config=text.to_dict(), audio_config=audio.to_dict(), projection_dim=8)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            around_one = "norm" in name.lower() and name.endswith("weight")  # LayerNorm / BatchNorm scales
            p.copy_(1.0 + 0.05 * torch.randn_like(p) if around_one else 0.2 * torch.randn_like(p))
        bn = model.audio_model.audio_encoder.batch_norm
        bn.running_mean.copy_(-40 + 5 * torch.randn_like(bn.running_mean))
        bn.running_var.copy_(300 + 50 * torch.rand_like(bn.running_var))
    model.save_pretrained(folder, safe_serialization=True)


def test_a_package_transformers_writes_loads_and_matches(tmp_path: Path) -> None:
    _perturbed_package(tmp_path, 11)
    reference = _reference(tmp_path)
    ours = load_clap(tmp_path)
    rng = np.random.default_rng(0)
    batch = (-60 + 20 * rng.standard_normal((3, 1, 180, 16))).astype(np.float32)
    rows = [[0, 5, 9, 2], [0, 7, 2], [0, 3, 4, 5, 6, 7, 8, 2]]
    ids = torch.tensor([[*r, *[1] * (8 - len(r))] for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (8 - len(r)) for r in rows])
    with torch.no_grad():
        want_audio = _pooled(reference.get_audio_features(input_features=torch.from_numpy(batch)))
        want_text = _pooled(reference.get_text_features(input_ids=ids, attention_mask=mask))
        assert np.abs(ours.embed_audio(torch.from_numpy(batch)).numpy() - want_audio).max() < 1e-5
        assert np.abs(ours.embed_text(rows).numpy() - want_text).max() < 1e-5
    assert np.abs(want_audio[0] - want_audio[1]).max() > 1e-2


def _config(package: Path, **audio: Any) -> dict[str, Any]:
    raw = json.loads((package / "config.json").read_text(encoding="utf-8"))
    raw["audio_config"].update(audio)
    return raw


@pytest.mark.parametrize(
    ("audio", "message"),
    [
        ({"enable_fusion": True}, r"^audio_config.enable_fusion is true: fused CLAP models are not supported$"),
        ({"window_size": 8}, "window_size 8 is larger than the last stage's 4×4 grid"),
        ({"hidden_size": 32}, "hidden_size 32 is not the last stage's width 64"),
        ({"spec_size": 60}, "spec_size 60 is not a multiple of num_mel_bins 16"),
        ({"num_attention_heads": [3, 4, 8]}, "stage 0's width 16 is not a multiple of 3 heads"),
        ({"patch_size": [4, 2]}, "only square sizes"),
    ],
)
def test_configs_we_cannot_read_are_refused_in_one_line(package: Path, audio: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        ClapConfig.from_dict(_config(package, **audio))
    assert "\n" not in str(caught.value)


def test_features_of_another_shape_are_refused(package: Path) -> None:
    ours = load_clap(package)
    with pytest.raises(ValueError, match=r"this tower reads \[B, 1, at most 256 frames, 16\]"):
        ours.embed_audio(torch.zeros(1, 4, 201, 16))
    with pytest.raises(ValueError, match="at most 256 frames"):
        ours.embed_audio(torch.zeros(1, 1, 300, 16))


def test_the_fixture_is_the_same_bytes_for_a_seed(tmp_path: Path, package: Path) -> None:
    from vllm_srun.adapters.families.fixtures.audio_fixture import write_audio_fixture

    for name, seed in (("again", 5), ("other", 6)):
        (tmp_path / name).mkdir()
        write_audio_fixture(tmp_path / name, "clap", seed=seed)
    weights = [
        (folder / "model.safetensors").read_bytes() for folder in (package, tmp_path / "again", tmp_path / "other")
    ]
    assert weights[0] == weights[1] and weights[0] != weights[2]
    for file in ("config.json", "tokenizer.json", "preprocessor_config.json"):
        assert (package / file).read_bytes() == (tmp_path / "other" / file).read_bytes()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"truncation": "fusion"}, "an unfused CLAP reads ClapFeatureExtractor's with truncation rand_trunc"),
        ({"feature_size": 32}, r"makes features of shape \(1, 201, 32\); the audio tower reads \(1, at most 256, 16\)"),
        ({"max_length_s": 3}, r"makes features of shape \(1, 301, 16\)"),
    ],
)
def test_a_preprocessor_the_tower_cannot_read_is_refused_at_load(
    tmp_path: Path, package: Path, change: dict[str, Any], message: str
) -> None:
    import shutil

    from vllm_srun.adapters.contracts import LoadContext
    from vllm_srun.adapters.devices.torch_devices import CpuDevice
    from vllm_srun.adapters.engines.registry import EngineRegistry
    from vllm_srun.adapters.families.audio import AudioFamily
    from vllm_srun.domain.settings.engine_args import EngineArgs

    folder = Path(shutil.copytree(package, tmp_path / "pkg"))
    path = folder / "preprocessor_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text(encoding="utf-8")), **change}), encoding="utf-8")
    context = LoadContext(device=CpuDevice(), args=EngineArgs(), engines=EngineRegistry())
    with pytest.raises(ValueError, match=message) as caught:
        AudioFamily().load(folder, context)
    assert "\n" not in str(caught.value)
    path.write_text(json.dumps(json.loads((package / "preprocessor_config.json").read_text(encoding="utf-8"))))
    model = AudioFamily().load(folder, context)  # the package as written loads
    assert model.max_input_tokens == 32 and model.lanes[0].name == "text"
