"""The decoders' fused Triton kernels on GPUs (R-DT-3, BF16 for the decision family):
residual+RMSNorm and SiLU·mul, each checked and chosen per forward size at load
(`gpu_kernels.choose`)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from vllm_srun.adapters.contracts import Device, Progress
from vllm_srun.adapters.engines.gpu_kernels import ENV, SIZES, KernelChoice, choose, mode, triton_unsupported
from vllm_srun.adapters.models.decoder import MLP, DecoderLM, DecoderOps, RMSNorm


class TritonDecoderOps(DecoderOps):
    """A decoder block's residual RMSNorms and/or SwiGLU product on the fused kernels."""

    def __init__(self, add_rms_norm: bool, silu_mul: bool) -> None:
        self.fused_norm, self.fused_mlp = add_rms_norm, silu_mul
        self.name = "+".join(n for n, on in (("add_rms_norm", add_rms_norm), ("silu_mul", silu_mul)) if on)

    def add_rms_norm(self, x: torch.Tensor, delta: torch.Tensor, norm: RMSNorm) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.fused_norm:
            return super().add_rms_norm(x, delta, norm)
        from vllm_srun.adapters.engines import triton_kernels

        return triton_kernels.add_rms_norm(x, delta, norm.weight, norm.eps)

    def mlp(self, mlp: MLP, x: torch.Tensor) -> torch.Tensor:
        if not self.fused_mlp:
            return super().mlp(mlp, x)
        from vllm_srun.adapters.engines import triton_kernels

        return mlp.down_proj(triton_kernels.silu_mul(mlp.gate_proj(x), mlp.up_proj(x)))


@dataclass
class GpuDecoderKernels:
    norm: KernelChoice
    mlp: KernelChoice
    _ops: dict[tuple[bool, bool], DecoderOps] = field(default_factory=dict)

    def for_tokens(self, tokens: int) -> DecoderOps | None:
        key = (self.norm.plan.use_fast(tokens), self.mlp.plan.use_fast(tokens))
        if not any(key):
            return None
        if key not in self._ops:
            self._ops[key] = TritonDecoderOps(*key)
        return self._ops[key]

    @property
    def switch_tokens(self) -> int | None:
        found = [c.plan.switch_tokens for c in (self.norm, self.mlp)]
        return min((s for s in found if s is not None), default=None)

    def card(self) -> dict[str, Any]:
        return {c.name: c.card() for c in (self.norm, self.mlp)}


def decoder_kernels(
    lm: DecoderLM, device: Device, progress: Progress, env: Mapping[str, str] = os.environ
) -> GpuDecoderKernels | str:
    """The fused kernels for LM on DEVICE (BF16, the published precision), or why none serve."""
    why = triton_unsupported(device, lm.dtype, torch.bfloat16)
    how = mode(env)
    if why is None and how == "off":
        why = f"turned off ({ENV}={env[ENV]})"
    if why is not None:
        return why
    block, cfg, dev = lm.model.blocks[0], lm.config, lm.device
    gen = torch.Generator(device=dev).manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=dev, dtype=torch.float32).to(lm.dtype)

    def norm_case(tokens: int) -> tuple[Callable[[], torch.Tensor], Callable[[], torch.Tensor]]:
        x, delta = randn(1, tokens, cfg.hidden_size), randn(1, tokens, cfg.hidden_size)
        fused = TritonDecoderOps(True, False)
        norm = block.post_attention_layernorm
        return (lambda: torch.cat(DecoderOps().add_rms_norm(x, delta, norm))), (
            lambda: torch.cat(fused.add_rms_norm(x, delta, norm))
        )

    def mlp_case(tokens: int) -> tuple[Callable[[], torch.Tensor], Callable[[], torch.Tensor]]:
        x = randn(1, tokens, cfg.hidden_size)
        fused = TritonDecoderOps(False, True)
        return (lambda: block.mlp(x)), (lambda: fused.mlp(block.mlp, x))

    progress(f"load: checking and timing Triton kernels against eager at {list(SIZES)} tokens")
    return GpuDecoderKernels(
        choose("add_rms_norm", norm_case, "bfloat16", device, how),
        choose("silu_mul", mlp_case, "bfloat16", device, how),
    )
