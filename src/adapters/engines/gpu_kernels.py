"""Fused Triton kernels on GPUs (R-DT-3), each chosen per forward size from load-time timings.

At load, on a CUDA or ROCm device with triton installed, at the published precision (encoders
FP32, decision models BF16; any other `--dtype` keeps the reference kernels, R-DT-2), each fused
kernel of `triton_kernels.py` is
1. checked: on random inputs its answers must equal the eager step's within `TOLERANCE` of the
   dtype (relative to their size), else it is never used;
2. timed against the eager step at a grid of forward sizes (`SIZES`, in tokens), in back-to-back
   pairs with the device synchronized, and turned into a `SizePlan` (`domain.kernels.plan_by_size`):
   a forward takes the kernel only at sizes where it was measurably faster, so it is never slower
   at a size that was measured.
`VLLM_SRUN_TRITON=0` keeps every forward on the eager kernels; `=1` puts every forward on the
fused kernels that passed the check (A/B). The card reports each kernel's plan, gap and speedups.

Encoders: `bias_gelu` (the first feed-forward linear's bias and activation), `add_layer_norm`
(both residual norms of a block) and `varlen_attention` (the unpadded forward's attention, one
launch instead of one SDPA per run of equal-length rows). Decoders: `add_rms_norm` and `silu_mul`.
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from vllm_srun.adapters.contracts import Device, Progress
from vllm_srun.adapters.models.bert import BertLayer
from vllm_srun.adapters.models.decoder import MLP, DecoderLM, DecoderOps, RMSNorm
from vllm_srun.adapters.models.reference_encoder import ReferenceEncoder
from vllm_srun.adapters.models.tokenization import Encoded
from vllm_srun.adapters.models.unpadded import EAGER_OPS, ForwardOps, LayerLinears, PackedRows, eager_linears
from vllm_srun.domain.devices import GPU_KINDS
from vllm_srun.domain.kernels import KernelTiming, SizePlan, plan_by_size

ENV = "VLLM_SRUN_TRITON"
SIZES = (64, 256, 1024, 4096, 16384)  # forward sizes timed at load, in tokens
TOLERANCE = {"float32": 1e-4, "bfloat16": 2e-2, "float16": 4e-3}
FORCED = SizePlan(((1 << 30, True),))
Clock = Callable[[], float]


def triton_unsupported(device: Device, dtype: torch.dtype, published: torch.dtype) -> str | None:
    """Why the fused kernels cannot serve here (one line), or None."""
    if device.kind not in GPU_KINDS:
        return f"device {device.name} is not a GPU"
    if dtype != published:
        return f"dtype {str(dtype).removeprefix('torch.')} runs the reference kernels (R-DT-2)"
    if torch.device(device.torch_device).type != "cuda":
        return f"device {device.name} is {device.torch_device} to torch, which Triton cannot launch on"
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed (pip install 'vllm-srun[gpu]')"
    return None


def mode(env: Mapping[str, str]) -> str:
    value = env.get(ENV, "").strip().lower()
    if value in ("0", "off", "false", "no"):
        return "off"
    if value in ("1", "on", "true", "yes", "force"):
        return "force"
    return "auto"


def numerics_gap(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got − want| relative to the answers' size (inf when GOT is not finite)."""
    got, want = got.float(), want.float()
    if not bool(torch.isfinite(got).all()):
        return float("inf")
    return float((got - want).abs().max()) / max(1.0, float(want.abs().max()))


def time_pair(
    eager: Callable[[], object], fast: Callable[[], object], sync: Callable[[], None], clock: Clock
) -> tuple[float, float]:
    """(eager seconds, fast seconds) of one back-to-back pair, the device synchronized around each."""
    out = []
    for run in (eager, fast):
        sync()
        started = clock()
        run()
        sync()
        out.append(clock() - started)
    return out[0], out[1]


def timing(
    tokens: int,
    eager: Callable[[], object],
    fast: Callable[[], object],
    sync: Callable[[], None],
    clock: Clock,
    reps: int,
) -> KernelTiming:
    """Median of REPS pairs (ABBA order); `fast_s` is the eager median over the median ratio."""
    eager(), fast()  # warm: compile and allocate for this shape
    pairs = []
    for rep in range(reps):
        if rep % 2:
            f, e = time_pair(fast, eager, sync, clock)
        else:
            e, f = time_pair(eager, fast, sync, clock)
        pairs.append((e, f))
    eager_s = statistics.median(e for e, _ in pairs)
    ratio = statistics.median(e / f if f > 0 else 1.0 for e, f in pairs)
    return KernelTiming(tokens, eager_s, eager_s / ratio if ratio > 0 else float("inf"))


@dataclass
class KernelChoice:
    """One fused kernel's outcome at load."""

    name: str
    plan: SizePlan = field(default_factory=SizePlan)
    gap: float | None = None
    timings: list[KernelTiming] = field(default_factory=list)
    reason: str = ""

    def card(self) -> dict[str, Any]:
        return {
            "fast_ranges": self.plan.fast_ranges(),
            "numerics_gap": float(f"{self.gap:.1e}") if self.gap is not None else None,
            "speedups": [[t.tokens, round(t.speedup, 2)] for t in self.timings],
            "reason": self.reason,
        }


def choose(
    name: str,
    case: Callable[[int], tuple[Callable[[], torch.Tensor], Callable[[], torch.Tensor]]],
    dtype: str,
    device: Device,
    how: str,
    sizes: Sequence[int] = SIZES,
    clock: Clock = time.perf_counter,
    reps: int = 5,
) -> KernelChoice:
    """Check, then time, one kernel: CASE(tokens) → (eager, fused) forwards of that size."""
    eager, fused = case(sizes[0])
    with torch.inference_mode():
        gap = numerics_gap(fused(), eager())
    tol = TOLERANCE.get(dtype, 1e-4)
    if not gap <= tol:
        return KernelChoice(name, gap=gap, reason=f"answers differ from eager by {gap:.1e} (> {tol:g})")
    if how == "force":
        return KernelChoice(name, FORCED, gap, reason=f"every forward ({ENV}=1)")
    timings = []
    with torch.inference_mode():
        for tokens in sizes:
            eager, fused = case(tokens)
            timings.append(timing(tokens, eager, fused, device.synchronize, clock, reps))
    plan = plan_by_size(timings)
    reason = "faster at the sizes listed" if plan.enabled else "not faster at any size measured"
    return KernelChoice(name, plan, gap, timings, reason)


# ---- encoders --------------------------------------------------------------------------------------
def fused_ffn_in(layer: BertLayer, activation: str, x: torch.Tensor) -> torch.Tensor:
    from vllm_srun.adapters.engines import triton_kernels

    return triton_kernels.bias_act(F.linear(x, layer.ffn_in.weight), layer.ffn_in.bias, activation)


class TritonEncoderOps(ForwardOps):
    """The unpadded forward's attention and/or residual norms on the fused kernels."""

    def __init__(self, attention: bool, add_norm: bool) -> None:
        self.fused_attention, self.fused_norm = attention, add_norm
        self.name = "+".join(n for n, on in (("varlen_attention", attention), ("add_layer_norm", add_norm)) if on)

    def attention(self, qkv: torch.Tensor, packed: PackedRows, heads: int) -> torch.Tensor:
        if not self.fused_attention:
            return super().attention(qkv, packed, heads)
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


# ---- decoders --------------------------------------------------------------------------------------
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
