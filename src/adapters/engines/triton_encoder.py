"""The encoders' fused Triton kernels on GPUs (R-DT-3): bias+GELU after the first feed-forward
matmul, residual+LayerNorm, and the unpadded forward's variable-length attention, each checked and
chosen per forward size at load (`gpu_kernels.choose`)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from vllm_srun.adapters.contracts import Device, Progress
from vllm_srun.adapters.engines.gpu_kernels import ENV, SIZES, KernelChoice, choose, mode, triton_unsupported
from vllm_srun.adapters.models.bert import BertEncoder, BertLayer
from vllm_srun.adapters.models.encoder_arch import eager_linears
from vllm_srun.adapters.models.reference_encoder import ReferenceEncoder
from vllm_srun.adapters.models.tokenization import Encoded
from vllm_srun.adapters.models.unpadded import EAGER_OPS, ForwardOps, LayerLinears, PackedRows, RelativeBias


def fused_ffn_in(layer: BertLayer, activation: str, x: torch.Tensor) -> torch.Tensor:
    from vllm_srun.adapters.engines import triton_kernels

    return triton_kernels.bias_act(F.linear(x, layer.ffn_in.weight), layer.ffn_in.bias, activation)


class TritonEncoderOps(ForwardOps):
    """The unpadded forward's attention and/or residual norms on the fused kernels."""

    def __init__(self, attention: bool, add_norm: bool) -> None:
        self.fused_attention, self.fused_norm = attention, add_norm
        self.name = "+".join(n for n, on in (("varlen_attention", attention), ("add_layer_norm", add_norm)) if on)

    def attention(
        self, qkv: torch.Tensor, packed: PackedRows, heads: int, relative: RelativeBias | None = None
    ) -> torch.Tensor:
        if not self.fused_attention or relative is not None:  # the kernel has no score bias
            return super().attention(qkv, packed, heads, relative)
        from vllm_srun.adapters.engines import triton_kernels

        return triton_kernels.varlen_attention(qkv, packed.bounds, packed.longest, heads)

    def add_norm(self, delta: torch.Tensor, residual: torch.Tensor, norm: torch.nn.LayerNorm) -> torch.Tensor:
        if not self.fused_norm:
            return super().add_norm(delta, residual, norm)
        from vllm_srun.adapters.engines import triton_kernels

        return triton_kernels.add_layer_norm(delta, residual, norm)


def _ragged_rows(tokens: int, longest: int, vocab: int) -> list[Encoded]:
    """Rows of mixed lengths (8 … LONGEST) adding up to about TOKENS, deterministic."""
    rows, total, r = [], 0, 0
    while total < tokens:
        n = min(tokens - total, 8 + (r * 37) % max(1, longest - 7))
        rows.append(Encoded([(7 * i + r) % vocab for i in range(n)], [0] * n, False, n))
        total, r = total + n, r + 1
    return rows


@dataclass
class GpuEncoderKernels:
    """The fused kernels an encoder's forwards take, per forward size."""

    ffn: KernelChoice
    norm: KernelChoice
    attention: KernelChoice
    fused_linears: list[LayerLinears]
    eager_linears: list[LayerLinears]
    _ops: dict[tuple[bool, bool], ForwardOps] = field(default_factory=dict)

    def for_tokens(self, tokens: int) -> tuple[list[LayerLinears], ForwardOps]:
        attn, norm = self.attention.plan.use_fast(tokens), self.norm.plan.use_fast(tokens)
        ops = self._ops.get((attn, norm))
        if ops is None:
            ops = EAGER_OPS if not (attn or norm) else TritonEncoderOps(attn, norm)
            self._ops[attn, norm] = ops
        linears = self.fused_linears if self.ffn.plan.use_fast(tokens) else self.eager_linears
        return linears, ops

    @property
    def switch_tokens(self) -> int | None:
        found = [c.plan.switch_tokens for c in (self.ffn, self.norm, self.attention)]
        return min((s for s in found if s is not None), default=None)

    def card(self) -> dict[str, Any]:
        return {c.name: c.card() for c in (self.ffn, self.norm, self.attention)}


def encoder_kernels(
    reference: ReferenceEncoder, device: Device, progress: Progress, env: Mapping[str, str] = os.environ
) -> GpuEncoderKernels | str:
    """The fused kernels for REFERENCE on DEVICE, or why none serve (one line)."""
    encoder = reference.encoder
    dtype = next(encoder.parameters()).dtype
    why = triton_unsupported(device, dtype, torch.float32)
    if why is None and not isinstance(encoder, BertEncoder):  # the fused kernels assume BERT's block
        why = f"the fused kernels serve BERT-style blocks; a {reference.config.model_type} model runs eager"
    how = mode(env)
    if why is None and how == "off":
        why = f"turned off ({ENV}={env[ENV]})"
    if why is not None:
        return why
    layer, cfg = encoder.blocks[0], reference.config
    dev, name = reference.device, str(dtype).removeprefix("torch.")
    gen = torch.Generator(device=dev).manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=dev, dtype=dtype)

    def ffn_case(tokens: int) -> tuple[Callable[[], torch.Tensor], Callable[[], torch.Tensor]]:
        x = randn(tokens, cfg.hidden_size)
        return (lambda: layer.act(layer.ffn_in(x))), (lambda: fused_ffn_in(layer, cfg.hidden_act, x))

    def norm_case(tokens: int) -> tuple[Callable[[], torch.Tensor], Callable[[], torch.Tensor]]:
        delta, residual = randn(tokens, cfg.hidden_size), randn(tokens, cfg.hidden_size)
        fused = TritonEncoderOps(False, True)
        return (lambda: EAGER_OPS.add_norm(delta, residual, layer.attn_norm)), (
            lambda: fused.add_norm(delta, residual, layer.attn_norm)
        )

    def attention_case(tokens: int) -> tuple[Callable[[], torch.Tensor], Callable[[], torch.Tensor]]:
        packed = PackedRows.build(_ragged_rows(tokens, min(cfg.max_tokens, 256), cfg.vocab_size), dev)
        qkv = randn(packed.tokens, 3 * cfg.hidden_size)
        fused = TritonEncoderOps(True, False)
        return (lambda: EAGER_OPS.attention(qkv, packed, layer.heads)), (
            lambda: fused.attention(qkv, packed, layer.heads)
        )

    progress(f"load: checking and timing Triton kernels against eager at {list(SIZES)} tokens")
    ffn = choose("bias_gelu", ffn_case, name, device, how)
    norm = choose("add_layer_norm", norm_case, name, device, how)
    attention = choose("varlen_attention", attention_case, name, device, how)
    fused = [
        LayerLinears(b.qkv, b.attn_out, partial(fused_ffn_in, b, cfg.hidden_act), b.ffn_out) for b in encoder.blocks
    ]
    return GpuEncoderKernels(ffn, norm, attention, fused, eager_linears(encoder))
