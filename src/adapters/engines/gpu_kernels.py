"""Fused Triton kernels on GPUs (R-DT-3), each chosen per forward size from load-time timings.

At load, on a CUDA or ROCm device with triton installed, at the published precision (encoders
FP32, decision models BF16; any other `--dtype` keeps the reference kernels, R-DT-2), each fused
kernel of `triton_kernels.py` is
1. checked: on random inputs its answers must equal the eager step's within `TOLERANCE` of the
   dtype (relative to their size), else it is never used;
2. timed against the eager step at a grid of forward sizes (`SIZES`, in tokens), in back-to-back
   pairs with the device synchronized, and turned into a `SizePlan` (`domain.worker.kernels.plan_by_size`):
   a forward takes the kernel only at sizes where it was measurably faster, so it is never slower
   at a size that was measured.
`VLLM_SRUN_TRITON=0` keeps every forward on the eager kernels; `=1` puts every forward on the
fused kernels that passed the check (A/B). The card reports each kernel's plan, gap and speedups.

Encoders (`triton_encoder.py`): `bias_gelu` (the first feed-forward linear's bias and activation),
`add_layer_norm` (both residual norms of a block) and `varlen_attention` (the unpadded forward's
attention, one launch instead of one SDPA per run of equal-length rows). Decoders
(`triton_decoder.py`): `add_rms_norm` and `silu_mul`. This module is the check, the timings and
the choice they share.
"""

from __future__ import annotations

import importlib.util
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from vllm_srun.adapters.contracts import Device
from vllm_srun.domain.settings.devices import GPU_KINDS
from vllm_srun.domain.worker.kernels import KernelTiming, SizePlan, plan_by_size

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
