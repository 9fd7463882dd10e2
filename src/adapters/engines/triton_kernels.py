"""Triton fused kernels for GPU forwards (R-DT-3), and the torch references they must equal.

- `bias_act`: a linear layer's bias and activation in one pass over its output (GELU exact or
  tanh, ReLU, SiLU), after a matmul without bias (encoders' first feed-forward linear);
- `add_layer_norm`: residual add + LayerNorm in one pass (encoders, twice per block);
- `varlen_attention`: attention over rows laid back to back without padding (the unpadded
  encoder, `models/unpadded.py`): one launch for every row and head, each row attending to its
  own tokens only, flash-style (online softmax over key blocks);
- `add_rms_norm`: residual add + RMSNorm, returning both the sum and the normed rows (decoders);
- `silu_mul`: SiLU(gate) · up (decoders' SwiGLU), BF16 in and out with FP32 arithmetic.

Each kernel computes in FP32 and rounds once where the eager module rounds (σ(x) is written as
1 / (1 + exp(−x)) with builtins only, so the kernels also compile in a process that runs Triton's
interpreter), so it equals the
eager forward within rounding (`tests/unit/test_triton_kernels.py`, run on a CPU under
`TRITON_INTERPRET=1`, which Triton reads once, at its import: `tests/conftest.py` sets it on
machines without a GPU); the engines use one only where load-time timings found it faster
(`engines/gpu_kernels.py`). This module imports triton; nothing imports it on a CPU install
(`engines/triton_encoder.py` and `triton_decoder.py` import it only when a GPU forward uses a kernel).
"""

import math

import torch
import triton
import triton.language as tl

ACTIVATIONS = {"gelu": 0, "gelu_new": 1, "gelu_pytorch_tanh": 1, "relu": 2, "silu": 3, "swish": 3}
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


# ---- kernels ----------------------------------------------------------------------------------------
@triton.jit
def _bias_act(X, B, Y, n_cols, stride_x, stride_y, ACT: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = cols < n_cols
    x = tl.load(X + row * stride_x + cols, mask=inside, other=0.0).to(tl.float32)
    x = x + tl.load(B + cols, mask=inside, other=0.0).to(tl.float32)
    x = x.to(Y.dtype.element_ty).to(tl.float32)  # the eager linear rounds its biased output once
    if ACT == 0:
        y = 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))
    elif ACT == 1:
        inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        y = 0.5 * x * (1.0 + (2.0 / (1.0 + tl.exp(-2.0 * inner)) - 1.0))  # tanh(u) = 2σ(2u) − 1
    elif ACT == 2:
        y = tl.maximum(x, 0.0)
    else:
        y = x / (1.0 + tl.exp(-x))
    tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=inside)


@triton.jit
def _add_layer_norm(X, R, W, B, Y, n_cols, stride, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < n_cols
    x = tl.load(X + row * stride + cols, mask=inside, other=0.0).to(tl.float32)
    x = x + tl.load(R + row * stride + cols, mask=inside, other=0.0).to(tl.float32)
    x = x.to(Y.dtype.element_ty).to(tl.float32)  # the eager sum is rounded to the model's dtype
    mean = tl.sum(x, axis=0) / n_cols
    centred = tl.where(inside, x - mean, 0.0)
    var = tl.sum(centred * centred, axis=0) / n_cols
    y = centred * (1.0 / tl.sqrt(var + eps))
    w = tl.load(W + cols, mask=inside, other=1.0).to(tl.float32)
    b = tl.load(B + cols, mask=inside, other=0.0).to(tl.float32)
    tl.store(Y + row * stride + cols, (y * w + b).to(Y.dtype.element_ty), mask=inside)


@triton.jit
def _add_rms_norm(X, D, W, S, Y, n_cols, stride, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < n_cols
    x = tl.load(X + row * stride + cols, mask=inside, other=0.0).to(tl.float32)
    x = x + tl.load(D + row * stride + cols, mask=inside, other=0.0).to(tl.float32)
    summed = x.to(S.dtype.element_ty)
    tl.store(S + row * stride + cols, summed, mask=inside)
    x = summed.to(tl.float32)
    normed = (x * tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)).to(Y.dtype.element_ty)
    w = tl.load(W + cols, mask=inside, other=0.0).to(tl.float32)
    tl.store(Y + row * stride + cols, (w * normed.to(tl.float32)).to(Y.dtype.element_ty), mask=inside)


@triton.jit
def _silu_mul(G, U, Y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < n
    g = tl.load(G + offs, mask=inside, other=0.0).to(tl.float32)
    u = tl.load(U + offs, mask=inside, other=0.0).to(tl.float32)
    tl.store(Y + offs, (g / (1.0 + tl.exp(-g)) * u).to(Y.dtype.element_ty), mask=inside)


@triton.jit
def _varlen_attention(
    QKV,
    OUT,
    STARTS,
    scale,
    stride_qkv,
    stride_o,
    HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    IEEE: tl.constexpr,
):
    block = tl.program_id(0)
    seq = tl.program_id(1)
    head = tl.program_id(2)
    start = tl.load(STARTS + seq)
    length = tl.load(STARTS + seq + 1) - start
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    live = (rows < length)[:, None] & (dims < HEAD_DIM)[None, :]
    hidden = HEADS * HEAD_DIM
    q_ptr = QKV + (start + rows)[:, None] * stride_qkv + head * HEAD_DIM + dims[None, :]
    q = tl.load(q_ptr, mask=live, other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for first in range(0, length, BLOCK_N):
        keys = first + tl.arange(0, BLOCK_N)
        k_live = (keys < length)[:, None] & (dims < HEAD_DIM)[None, :]
        kv_off = (start + keys)[:, None] * stride_qkv + head * HEAD_DIM + dims[None, :]
        k = tl.load(QKV + hidden + kv_off, mask=k_live, other=0.0)
        v = tl.load(QKV + 2 * hidden + kv_off, mask=k_live, other=0.0)
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = tl.where((keys < length)[None, :], s * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    o_ptr = OUT + (start + rows)[:, None] * stride_o + head * HEAD_DIM + dims[None, :]
    tl.store(o_ptr, out.to(OUT.dtype.element_ty), mask=live)


def _row_block(n_cols: int) -> int:
    return max(16, triton.next_power_of_2(n_cols))


# ---- launchers: tensors in, tensors out ------------------------------------------------------------
def bias_act(x: torch.Tensor, bias: torch.Tensor, activation: str) -> torch.Tensor:
    """act(x + bias) over the last dimension of X (any leading shape)."""
    flat = x.reshape(-1, x.shape[-1])
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    rows, n_cols = flat.shape
    out = torch.empty_like(flat)
    block = min(1024, _row_block(n_cols))
    grid = (rows, triton.cdiv(n_cols, block))
    _bias_act[grid](flat, bias, out, n_cols, flat.stride(0), out.stride(0), ACT=ACTIVATIONS[activation], BLOCK=block)
    return out.view(x.shape)


def add_layer_norm(x: torch.Tensor, residual: torch.Tensor, norm: torch.nn.LayerNorm) -> torch.Tensor:
    """norm(x + residual), rows of [N, H] contiguous."""
    x, residual = x.contiguous(), residual.contiguous()
    rows, n_cols = x.shape
    out = torch.empty_like(x)
    _add_layer_norm[(rows,)](
        x, residual, norm.weight, norm.bias, out, n_cols, x.stride(0), norm.eps, BLOCK=_row_block(n_cols)
    )
    return out


def add_rms_norm(
    x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + delta, rms_norm(x + delta) · weight) over the last dimension."""
    shape = x.shape
    x, delta = x.reshape(-1, shape[-1]).contiguous(), delta.reshape(-1, shape[-1]).contiguous()
    rows, n_cols = x.shape
    summed, normed = torch.empty_like(x), torch.empty_like(x)
    _add_rms_norm[(rows,)](x, delta, weight, summed, normed, n_cols, x.stride(0), eps, BLOCK=_row_block(n_cols))
    return summed.view(shape), normed.view(shape)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) · up, elementwise."""
    gate, up = gate.contiguous(), up.contiguous()
    out = torch.empty_like(gate)
    n = gate.numel()
    block = 1024
    _silu_mul[(triton.cdiv(n, block),)](gate, up, out, n, BLOCK=block)
    return out


def varlen_attention(qkv: torch.Tensor, starts: torch.Tensor, max_len: int, heads: int) -> torch.Tensor:
    """Attention of rows laid back to back: QKV [N, 3·H] (per token: Q, K, V, each heads × d),
    STARTS int32 [B + 1] (each row's first token, then N), MAX_LEN the longest row → [N, H]."""
    n_tokens, width = qkv.shape
    hidden = width // 3
    head_dim = hidden // heads
    if qkv.stride(-1) != 1:
        qkv = qkv.contiguous()
    out = torch.empty(n_tokens, hidden, device=qkv.device, dtype=qkv.dtype)
    # FP32 dots run exact (IEEE) FMAs, not tensor cores: smaller tiles keep them in registers
    block_m = block_n = 16 if max_len <= 16 else 32 if qkv.dtype == torch.float32 or max_len <= 32 else 64
    grid = (triton.cdiv(max_len, block_m), starts.numel() - 1, heads)
    _varlen_attention[grid](
        qkv,
        out,
        starts,
        1.0 / math.sqrt(head_dim),
        qkv.stride(0),
        out.stride(0),
        HEADS=heads,
        HEAD_DIM=head_dim,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        IEEE=qkv.dtype == torch.float32,
    )
    return out
