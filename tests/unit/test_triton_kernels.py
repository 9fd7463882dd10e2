"""The fused Triton kernels (R-DT-3) equal their torch references on small shapes, run by Triton's
interpreter on a CPU (TRITON_INTERPRET=1, set by tests/conftest.py) or compiled on a GPU; and each
compiles, ahead of time and without a GPU, for the GPUs we serve (sm_80, sm_90, gfx942) at the
dtypes the engines launch it with."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

triton = pytest.importorskip("triton")
pytestmark = pytest.mark.triton

from vllm_srun.adapters.engines import triton_kernels as tk  # noqa: E402
from vllm_srun.adapters.models.decoder import RMSNorm  # noqa: E402

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
if not GPU and not triton.knobs.runtime.interpret:
    pytest.skip("without a GPU the kernels run only under TRITON_INTERPRET=1", allow_module_level=True)
# half precision under the interpreter: float16 (numpy has no bfloat16); BF16 is compiled below
HALF = torch.bfloat16 if GPU else torch.float16
TOL = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def _randn(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(DEVICE, dtype)


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype and got.device == want.device
    gap = (got.float() - want.float()).abs().max().item() / max(1.0, want.float().abs().max().item())
    assert gap <= TOL[dtype], gap


@pytest.mark.parametrize(
    ("activation", "reference"),
    [
        ("gelu", F.gelu),
        ("gelu_new", lambda t: F.gelu(t, approximate="tanh")),
        ("relu", F.relu),
        ("silu", F.silu),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, HALF])
def test_bias_act(activation: str, reference: Any, dtype: torch.dtype) -> None:
    x, bias = _randn(7, 40, dtype=dtype), _randn(40, dtype=dtype, seed=1)
    _close(tk.bias_act(x, bias, activation), reference(x + bias), dtype)
    wide = _randn(3, 1500, dtype=dtype, seed=2)  # more columns than one block holds
    _close(tk.bias_act(wide, _randn(1500, dtype=dtype), activation), reference(wide + _randn(1500, dtype=dtype)), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, HALF])
def test_add_layer_norm(dtype: torch.dtype) -> None:
    norm = torch.nn.LayerNorm(48, eps=1e-12).to(DEVICE, dtype)
    with torch.no_grad():
        norm.weight.copy_(_randn(48, dtype=dtype, seed=3))
        norm.bias.copy_(_randn(48, dtype=dtype, seed=4))
    x, residual = _randn(9, 48, dtype=dtype), _randn(9, 48, dtype=dtype, seed=5)
    with torch.inference_mode():
        _close(tk.add_layer_norm(x, residual, norm), norm(x + residual), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, HALF])
def test_add_rms_norm_returns_the_sum_and_its_norm(dtype: torch.dtype) -> None:
    norm = RMSNorm(40, 1e-6).to(DEVICE, dtype)
    with torch.no_grad():
        norm.weight.copy_(_randn(40, dtype=dtype, seed=6))
    x, delta = _randn(2, 5, 40, dtype=dtype), _randn(2, 5, 40, dtype=dtype, seed=7)
    with torch.inference_mode():
        summed, normed = tk.add_rms_norm(x, delta, norm.weight, norm.eps)
        _close(summed, x + delta, dtype)
        _close(normed, norm(x + delta), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, HALF])
def test_silu_mul(dtype: torch.dtype) -> None:
    gate, up = _randn(3, 4, 700, dtype=dtype), _randn(3, 4, 700, dtype=dtype, seed=8)
    _close(tk.silu_mul(gate, up), F.silu(gate) * up, dtype)


def _per_row_attention(qkv: torch.Tensor, lengths: list[int], heads: int) -> torch.Tensor:
    out, start = [], 0
    hidden = qkv.shape[1] // 3
    for n in lengths:
        part = qkv[start : start + n].float().view(n, 3, heads, hidden // heads).permute(1, 2, 0, 3)
        out.append(F.scaled_dot_product_attention(part[0], part[1], part[2]).transpose(0, 1).reshape(n, hidden))
        start += n
    return torch.cat(out).to(qkv.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, HALF])
@pytest.mark.parametrize(
    ("lengths", "heads", "head_dim"),
    [
        ([5], 2, 8),  # one row
        ([70, 33, 33, 1, 12], 2, 16),  # ragged, longer than a key block, a run of two, a lone token
        ([20, 20, 20], 4, 12),  # head size below its block (masked lanes)
    ],
)
def test_varlen_attention_equals_attention_per_row(
    lengths: list[int], heads: int, head_dim: int, dtype: torch.dtype
) -> None:
    qkv = _randn(sum(lengths), 3 * heads * head_dim, dtype=dtype)
    bounds = torch.tensor([0, *lengths], dtype=torch.int32).cumsum(0, dtype=torch.int32).to(DEVICE)
    got = tk.varlen_attention(qkv, bounds, max(lengths), heads)
    _close(got, _per_row_attention(qkv, lengths, heads), dtype)


# ---- ahead-of-time compilation (no GPU needed) ------------------------------------------------------
def test_kernels_compile_for_the_gpus_we_serve() -> None:
    """sm_80 (Ampere), sm_90 (Hopper) and gfx942 (MI300), at the dtypes the engines launch: in a
    process of its own, since this one ran Triton's interpreter (tools/compile_triton_kernels.py)."""
    tool = Path(__file__).resolve().parents[2] / "tools" / "compile_triton_kernels.py"
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    done = subprocess.run([sys.executable, str(tool)], capture_output=True, text=True, env=env, timeout=300)
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    for target in ("cuda:80", "cuda:90", "hip:gfx942"):
        assert sum(line.startswith(f"ok   {target} ") for line in lines) == 7, done.stdout
