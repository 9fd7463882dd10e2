"""R-PKG-2: our torch CLIP and SigLIP dual encoders against `transformers`' `CLIPModel` and
`SiglipModel` (test-only references), FP32, within 1e-5: text and image embeddings, each row
alone and in batches, the projections into one space and the normalization. Weights are random
(tiny configs built here with `transformers`, larger than their init so parity is a real test),
so these tests check the math, not semantic quality."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from vllm_srun.adapters.models.dual_encoder import load_dual_encoder

transformers = pytest.importorskip("transformers")

TOL = 1e-5
TEXT = dict(vocab_size=99, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
VISION = dict(hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4)


def _scramble(model: torch.nn.Module, seed: int) -> None:
    """Replace the default init with larger random values (LayerNorm gains near 1)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            is_gain = ("norm" in name or "layernorm" in name) and name.endswith("weight")
            p.copy_(1.0 + 0.2 * noise if is_gain else 0.3 * noise)


def _clip(folder: Path, eos: int = 98, act: str = "quick_gelu", image: int = 32, patch: int = 8) -> Any:
    cfg = transformers.CLIPConfig(
        text_config={**TEXT, "max_position_embeddings": 20, "eos_token_id": eos, "pad_token_id": 0, "hidden_act": act},
        vision_config={**VISION, "image_size": image, "patch_size": patch, "hidden_act": act},
        projection_dim=24,
    )
    model = transformers.CLIPModel(cfg)
    _scramble(model, 1)
    model.eval().save_pretrained(folder)
    return model


def _siglip(folder: Path, act: str = "gelu_pytorch_tanh") -> Any:
    cfg = transformers.SiglipConfig(
        text_config={
            **TEXT,
            "max_position_embeddings": 16,
            "pad_token_id": 1,
            "hidden_act": act,
            "projection_size": 40,
        },
        vision_config={**VISION, "hidden_size": 40, "image_size": 32, "patch_size": 8, "hidden_act": act},
    )
    model = transformers.SiglipModel(cfg)
    _scramble(model, 2)
    model.eval().save_pretrained(folder)
    return model


def _unit(x: Any) -> np.ndarray:
    out = x.pooler_output if hasattr(x, "pooler_output") else x
    return (out / out.norm(dim=-1, keepdim=True)).numpy()


def _gap(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(np.asarray(a) - np.asarray(b)).max())


def _images(n: int, size: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


# CLIP rows end with the end-of-text token (98); the legacy config (eos_token_id 2) pools at the largest id
CLIP_ROWS = [[5, 6, 7, 98], [3, 98], [9, 10, 11, 12, 13, 14, 15, 98], [40, 41, 98]]


@pytest.mark.parametrize(("eos", "act"), [(98, "quick_gelu"), (2, "gelu"), (98, "gelu_new")])
def test_clip_text_and_image_embeddings_match_alone_and_batched(tmp_path: Path, eos: int, act: str) -> None:
    reference = _clip(tmp_path, eos, act)
    ours = load_dual_encoder(tmp_path)
    pixels = _images(5, 32)
    width = max(map(len, CLIP_ROWS))
    ids = torch.tensor([r + [0] * (width - len(r)) for r in CLIP_ROWS])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in CLIP_ROWS])
    with torch.no_grad():
        want_images = _unit(reference.get_image_features(pixel_values=pixels))
        want_text = _unit(reference.get_text_features(input_ids=ids, attention_mask=mask))
        got_images = ours.embed_images(pixels).numpy()
        got_text = ours.embed_text(CLIP_ROWS).numpy()
        alone_images = np.concatenate([ours.embed_images(pixels[i : i + 1]).numpy() for i in range(5)])
        alone_text = np.concatenate([ours.embed_text([r]).numpy() for r in CLIP_ROWS])
    for got in (got_images, alone_images):
        assert _gap(got, want_images) < TOL
    for got in (got_text, alone_text):
        assert _gap(got, want_text) < TOL
    assert got_text.shape == (4, 24) and got_images.shape == (5, 24)


def test_siglip_text_and_image_embeddings_match_alone_and_batched(tmp_path: Path) -> None:
    reference = _siglip(tmp_path)
    ours = load_dual_encoder(tmp_path)
    pixels = _images(4, 32, seed=1)
    rows = [[5, 6, 7, 1], [3, 1], [9, 10, 11, 12, 13, 14, 1]]
    padded = torch.tensor([r + [1] * (16 - len(r)) for r in rows])  # SigLIP reads rows padded to its positions
    with torch.no_grad():
        want_images = _unit(reference.get_image_features(pixel_values=pixels))
        want_text = _unit(reference.get_text_features(input_ids=padded))
        got_images = ours.embed_images(pixels).numpy()
        got_text = ours.embed_text(rows).numpy()
        alone_images = np.concatenate([ours.embed_images(pixels[i : i + 1]).numpy() for i in range(4)])
        alone_text = np.concatenate([ours.embed_text([r]).numpy() for r in rows])
    for got in (got_images, alone_images):
        assert _gap(got, want_images) < TOL
    for got in (got_text, alone_text):
        assert _gap(got, want_text) < TOL
    assert got_text.shape == (3, 40) and got_images.shape == (4, 40)


@pytest.mark.parametrize("kind", ["clip", "siglip"])
def test_text_and_images_share_one_space(tmp_path: Path, kind: str) -> None:
    """The reference's own image-text logits are our embeddings' dot products, scaled as it scales them."""
    reference = _clip(tmp_path) if kind == "clip" else _siglip(tmp_path)
    ours = load_dual_encoder(tmp_path)
    pixels = _images(3, 32, seed=2)
    rows = CLIP_ROWS[:3] if kind == "clip" else [[5, 6, 1], [7, 1], [8, 9, 10, 1]]
    width = max(map(len, rows)) if kind == "clip" else 16
    pad = 0 if kind == "clip" else 1
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    kwargs = {"attention_mask": (ids != 0).long()} if kind == "clip" else {}
    with torch.no_grad():
        out = reference(input_ids=ids, pixel_values=pixels, **kwargs)
        similarity = ours.embed_text(rows) @ ours.embed_images(pixels).T
        logits = similarity * reference.logit_scale.exp()
        if kind == "siglip":
            logits = logits + reference.logit_bias
    assert _gap(out.text_embeds.numpy(), ours.embed_text(rows).numpy()) < TOL
    assert _gap(out.image_embeds.numpy(), ours.embed_images(pixels).numpy()) < TOL
    assert _gap(out.logits_per_text.numpy(), logits.numpy()) < 1e-4
    norms = np.linalg.norm(ours.embed_images(pixels).numpy(), axis=1)
    assert np.allclose(norms, 1.0, atol=1e-6)


def test_a_larger_vision_tower_in_224_pixels(tmp_path: Path) -> None:
    """A ViT-B/32-shaped grid (7 × 7 patches of 32 pixels) with a small width."""
    reference = _clip(tmp_path, image=224, patch=32)
    ours = load_dual_encoder(tmp_path)
    pixels = _images(3, 224, seed=3)
    with torch.no_grad():
        want = _unit(reference.get_image_features(pixel_values=pixels))
        got = ours.embed_images(pixels).numpy()
    assert _gap(got, want) < TOL


@pytest.mark.parametrize("variant", ["clip", "siglip"])
def test_fixture_packages_are_what_transformers_reads(multimodal_fixture: Callable[..., Path], variant: str) -> None:
    """Our fixture writer's packages load in `transformers` as they are, and answer as ours do."""
    folder = multimodal_fixture(variant)
    model_class = transformers.CLIPModel if variant == "clip" else transformers.SiglipModel
    reference = model_class.from_pretrained(folder).eval()
    ours = load_dual_encoder(folder)
    pixels = _images(2, 32, seed=4)
    rows = [[0, 5, 6, 1], [0, 7, 1]] if variant == "clip" else [[5, 6, 1], [7, 1]]
    width = 4 if variant == "clip" else 16
    ids = torch.tensor([r + [1] * (width - len(r)) for r in rows])
    with torch.no_grad():
        assert _gap(ours.embed_images(pixels).numpy(), _unit(reference.get_image_features(pixel_values=pixels))) < TOL
        assert _gap(ours.embed_text(rows).numpy(), _unit(reference.get_text_features(input_ids=ids))) < TOL


def test_a_checkpoint_that_does_not_fit_its_config_is_refused_in_one_line(tmp_path: Path) -> None:
    import json

    from vllm_srun.adapters.models.weights import WeightsError

    _clip(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["projection_dim"] = 8
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(WeightsError, match=r"does not fit its config\.json"):
        load_dual_encoder(tmp_path)
    config["model_type"] = "bert"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="not a dual encoder"):
        load_dual_encoder(tmp_path)
