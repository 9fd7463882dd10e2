"""The int8 package format (`models/quantize.py`), the per-token quantization of the int8 linears'
inputs (`engines/cpu_int8.quantize_tokens`, the torch path), the CPU gate and the refusals of
`vllm-srun quantize` that come before any weights load (`app/quantize.py`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from vllm_srun.adapters.engines.cpu_int8 import LEVELS, finish_rows, int8_unsupported, quantize_tokens
from vllm_srun.adapters.model_store import LocalModelStore
from vllm_srun.adapters.models.quantize import (
    QMAX,
    QUANT_KEY,
    QUANT_METHOD,
    canonical_scales,
    dequantize_rows,
    int8_grid,
    quantization_marker,
    quantize_rows,
    read_quantization,
)
from vllm_srun.adapters.models.quantize_package import checkpoint_sources
from vllm_srun.app.quantize import default_requests, quantize


def _weights(seed: int = 0) -> torch.Tensor:
    """Rows of very different sizes (and one all zero), as real checkpoints have."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(48, 40, generator=gen) * torch.logspace(-4, 2, 48)[:, None]
    w[7] = 0.0
    return w


def test_each_row_gets_its_own_scale_with_its_peak_at_127() -> None:
    w = _weights()
    q, scale = quantize_rows(w)
    assert q.dtype == torch.int8 and q.shape == w.shape and scale.dtype == torch.float32 and scale.shape == (48,)
    peaks = q.abs().amax(1)
    assert peaks[7] == 0 and scale[7] == 1.0  # an all-zero row: codes 0, scale 1
    nonzero = [i for i in range(48) if i != 7]
    assert (peaks[nonzero] == QMAX).all()
    assert torch.allclose(scale[nonzero], w[nonzero].abs().amax(1) / QMAX, rtol=1e-6, atol=0)
    # per channel: every element within half a step of its row's scale
    err = (dequantize_rows(q, scale) - w).abs()
    assert (err <= scale[:, None] * 0.5 * (1 + 1e-5)).all()


def test_rows_quantize_alone() -> None:
    """Quantizing Q, K and V apart equals quantizing their concatenation (what the package writer relies on)."""
    w = _weights(1)
    parts = [quantize_rows(p) for p in w.split([16, 16, 16])]
    whole = quantize_rows(w)
    assert torch.equal(torch.cat([q for q, _ in parts]), whole[0])
    assert torch.equal(torch.cat([s for _, s in parts]), whole[1])


def test_dequantized_weights_give_back_the_same_int8_bit_for_bit() -> None:
    for seed in range(5):
        q, scale = quantize_rows(_weights(seed))
        grid = int8_grid(dequantize_rows(q, scale))
        assert grid is not None
        assert torch.equal(grid[0], q) and torch.equal(grid[1], scale)
    assert int8_grid(_weights()) is None  # an FP32 weight is not on an int8 grid


def test_canonical_scales_are_their_own_round_trip() -> None:
    gen = torch.Generator().manual_seed(3)
    s = canonical_scales(torch.rand(100_000, generator=gen) * torch.exp(torch.randn(100_000, generator=gen) * 4))
    assert torch.equal((s * QMAX) / QMAX, s)


def test_quantization_marker_is_read_and_a_foreign_one_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    assert read_quantization(tmp_path) is None
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", QUANT_KEY: quantization_marker()}))
    marker = read_quantization(tmp_path)
    assert marker is not None and marker["quant_method"] == QUANT_METHOD and marker["bits"] == 8
    for foreign, words in (
        ({"quant_method": "bitsandbytes", "load_in_8bit": True}, "'bitsandbytes'"),
        ({**quantization_marker(), "bits": 4}, "bits 4"),
    ):
        (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", QUANT_KEY: foreign}))
        with pytest.raises(ValueError, match=words) as err:
            read_quantization(tmp_path)
        assert "\n" not in str(err.value)


def test_tokens_quantize_row_by_row_within_half_a_step() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(9, 64, generator=gen) * torch.logspace(-3, 3, 9)[:, None]
    x[2] = 0.0  # an all-zero row
    x[3] = x[3].abs()  # all positive: zero point 0
    x[4] = -x[4].abs()  # all negative
    x[5, 0] = 0.0
    codes, step, zero = quantize_tokens(x, 16)
    assert codes.dtype == torch.uint8 and codes.shape == (16, 64) and step.shape == zero.shape == (9, 1)
    assert (codes[9:] == 0).all()  # the bucket's padding rows
    assert int(codes[:9].max()) <= LEVELS + 1
    back = (codes[:9].float() - zero) * step
    assert ((back - x).abs() <= step * 0.5 * (1 + 1e-4) + 1e-30).all()
    assert (codes[2] == 0).all() and zero[2] == 0 and zero[3] == 0
    assert codes[5, 0] == zero[5]  # 0 is exactly representable
    # a row's codes do not depend on the other rows
    for i in range(9):
        alone = quantize_tokens(x[i : i + 1].clone(), 1)
        assert torch.equal(alone[0][0], codes[i]) and torch.equal(alone[1][0], step[i])


def test_finishing_removes_the_zero_points_share() -> None:
    """(codes − zero) · Wᵀ × step + bias, from codes · Wᵀ, the zero point and W's row sums."""
    gen = torch.Generator().manual_seed(1)
    x, w, bias = torch.randn(5, 32, generator=gen), torch.randn(8, 32, generator=gen), torch.randn(8, generator=gen)
    codes, step, zero = quantize_tokens(x, 5)
    acc = codes.double() @ w.double().t()
    out = acc.float().clone()
    finish_rows(out, zero, step, w.sum(1), bias)
    want = ((codes.double() - zero.double()) @ w.double().t()) * step.double() + bias.double()
    assert torch.allclose(out.double(), want, rtol=1e-5, atol=1e-4)
    bound = step * 0.5 * w.abs().sum(1) + 1e-4  # each input within half its row's step
    assert ((out - (x @ w.t() + bias)).abs() <= bound).all()


def test_cpu_gate_names_what_is_missing() -> None:
    vnni = frozenset({"avx512f", "avx512_vnni"})
    assert "device cuda" in str(int8_unsupported("cuda", torch.float32, vnni))
    assert "not x86" in str(int8_unsupported("cpu", torch.float32, vnni, machine="aarch64"))
    no_vnni = int8_unsupported("cpu", torch.float32, frozenset({"avx2", "avx512f"}), machine="x86_64")
    assert no_vnni is not None and "avx512_vnni" in no_vnni and "amx_int8" in no_vnni and "\n" not in no_vnni
    bf16 = int8_unsupported("cpu", torch.bfloat16, vnni, machine="x86_64")
    assert bf16 is not None and "bfloat16" in bf16


def test_checkpoint_tensors_are_found_by_their_rows() -> None:
    """Each block linear is made of runs of whole checkpoint tensors (Q, K, V → qkv); a linear whose
    rows the checkpoint does not hold as they are is refused."""
    gen = torch.Generator().manual_seed(2)
    q, k, v, o = (torch.randn(4, 4, generator=gen) for _ in range(4))
    up, down = torch.randn(8, 4, generator=gen), torch.randn(4, 8, generator=gen)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv, self.attn_out = nn.Linear(4, 12), nn.Linear(4, 4)
            self.ffn_in, self.ffn_out = nn.Linear(4, 8), nn.Linear(8, 4)
            with torch.no_grad():
                self.qkv.weight.copy_(torch.cat([q, k, v]))
                self.attn_out.weight.copy_(o)
                self.ffn_in.weight.copy_(up)
                self.ffn_out.weight.copy_(down)

    class Encoder:
        blocks = [Block()]

    file = Path("model.safetensors")
    names = {"q": q, "k": k, "v": v, "o": o, "up": up, "down": down, "emb": torch.randn(30, 4, generator=gen)}
    found = checkpoint_sources(Encoder(), {file: (dict(names), None)})
    assert {name: where for (_, name), where in found.items()} == {
        "q": (0, "qkv"),
        "k": (0, "qkv"),
        "v": (0, "qkv"),
        "o": (0, "attn_out"),
        "up": (0, "ffn_in"),
        "down": (0, "ffn_out"),
    }
    names["k"] = k * 2  # the loader would have to transform it
    with pytest.raises(ValueError, match="block 0's qkv") as err:
        checkpoint_sources(Encoder(), {file: (names, None)})
    assert "\n" not in str(err.value)


def _package(folder: Path, config: dict, manifest: dict | None = None) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    if manifest is not None:
        (folder / "srun.json").write_text(json.dumps(manifest))
    return folder


def test_quantize_refusals_before_any_weights_load(tmp_path: Path) -> None:
    store = LocalModelStore(tmp_path / "store")
    bert = _package(tmp_path / "bert", {"model_type": "bert"})
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "x").write_text("")
    cases = [
        (str(bert), taken, None, "exists and is not an empty folder"),
        ("no-such-model", tmp_path / "o1", None, "not a folder, not in the model store"),
        (
            str(_package(tmp_path / "int8", {"model_type": "bert", QUANT_KEY: quantization_marker()})),
            tmp_path / "o2",
            None,
            "already an int8 package",
        ),
        (
            str(_package(tmp_path / "decision", {"model_type": "llama"}, {"family": "decision"})),
            tmp_path / "o3",
            None,
            "is a decision model: only encoder packages",
        ),
        (str(bert), tmp_path / "o4", frozenset({"avx2"}), "cannot record the int8 package's golden answers"),
    ]
    for model, out, flags, words in cases:
        with pytest.raises(ValueError, match=words) as err:
            quantize(model, out, progress=lambda _: None, store=store, cpu_flags=flags)
        assert "\n" not in str(err.value)
        assert out == taken or not out.exists()  # nothing written
    assert not list(tmp_path.glob(".*partial*"))


def test_default_golden_requests_cover_each_surface() -> None:
    requests = default_requests(frozenset({"embeddings", "rerank"}))
    assert [r["surface"] for r in requests] == ["embeddings", "rerank"]
    assert requests[1]["body"]["documents"] and np.ndim(requests[0]["body"]["input"]) == 1
