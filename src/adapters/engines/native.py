"""The native (torch) engine for encoders, with the oneDNN fast path where it is measured to help.

`native_encoder(runner, device, progress)` decides, once at load on the device thread:
1. gate: `VLLM_SRUN_ONEDNN=0` turns the fast path off (A/B); otherwise it needs an x86 CPU,
   oneDNN and FP32 weights (`cpu_onednn.onednn_unsupported`);
2. numerics: the packed forward must give the eager forward's answers (pooled embeddings,
   logits) on a ragged probe batch within `NUMERICS_TOL` (relative to the answers' size);
3. speed: one layer's linears timed on both paths over a grid of row counts (interleaved,
   fastest of several runs), turned into a `KernelPlan` by `domain.kernels.plan_kernels`: the packed copies
   serve forwards up to the largest size where they won at every size measured, eager the rest.
The card reports the outcome as `kernels: {linear: onednn_packed|eager, reason, ...}`. The
readiness check and the probe run after this, through `embed`/`classify_logits`: the path that serves.
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from vllm_srun.adapters.engines.cpu_onednn import PackedEncoder, onednn_unsupported
from vllm_srun.adapters.models.encoder_runner import EncoderRunner
from vllm_srun.adapters.models.pooling import pool
from vllm_srun.domain.kernels import (DEFAULT_MIN_SPEEDUP, KernelPlan, KernelTiming, bucket_rows, plan_kernels,
                                      timing_grid)

log = logging.getLogger("vllm_srun.engines.native")
ENV = "VLLM_SRUN_ONEDNN"
NUMERICS_TOL = 1e-5
Progress = Callable[[str], None]


class NativeEncoder:
    """Our torch encoder; forwards the plan sends to the fast path run on the packed copies."""

    engine = "native"

    def __init__(self, runner: EncoderRunner, packed: PackedEncoder | None = None,
                 plan: KernelPlan = KernelPlan(), kernels: dict[str, Any] | None = None) -> None:
        self.runner = runner
        self.packed = packed if plan.enabled else None
        self.plan = plan if packed is not None else KernelPlan()
        self.kernels = kernels or {"linear": "eager", "reason": "reference kernels"}

    @property
    def kernel_switch_tokens(self) -> int | None:
        return self.plan.fast_up_to if self.packed is not None else None

    def describe(self) -> dict[str, Any]:
        return {"kernels": dict(self.kernels)}

    def _fast(self, ids: torch.Tensor, mask: torch.Tensor | None) -> tuple[PackedEncoder, list[int]] | None:
        if self.packed is None or not self.plan.use_fast(ids.numel()):
            return None
        b, t = ids.shape
        lengths = [t] * b if mask is None else mask.sum(dim=1).tolist()
        return self.packed, lengths

    def embed(self, batch: Sequence[Any]) -> np.ndarray:
        with torch.inference_mode():
            ids, mask, types = self.runner.tensors(batch)
            fast = self._fast(ids, mask)
            if fast is None:
                return self.runner.embed(batch)
            packed, lengths = fast
            hidden = packed.hidden(ids, lengths, types)
            return self.runner.numpy(packed.pooled(hidden, lengths, self.runner.pooling))

    def classify_logits(self, batch: Sequence[Any]) -> np.ndarray:
        with torch.inference_mode():
            ids, mask, types = self.runner.tensors(batch)
            fast = self._fast(ids, mask)
            if fast is None or fast[0].classifier is None:
                return self.runner.classify_logits(batch)
            packed, lengths = fast
            return self.runner.numpy(packed.logits(packed.hidden(ids, lengths, types)))


def _probe_batch(runner: EncoderRunner) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """A ragged batch of pseudo-random ids (longest first), deterministic, within the model's positions."""
    gen = torch.Generator().manual_seed(1234)
    top = max(2, min(runner.config.max_tokens, 64))
    lengths = sorted({min(top, n) for n in (top, 33, 17, 17, 5, 2)}, reverse=True)
    lengths = sorted([*lengths, lengths[-1]], reverse=True)  # a run of two equal rows
    ids = torch.randint(0, runner.config.vocab_size, (len(lengths), lengths[0]), generator=gen)
    mask = torch.arange(lengths[0])[None, :] < torch.tensor(lengths)[:, None]
    ids = ids.masked_fill(~mask, runner.pad_id)
    return ids, mask, lengths


def numerics_gap(runner: EncoderRunner, packed: PackedEncoder) -> float:
    """Largest |packed − eager| over the served answers of a probe batch, relative to their size."""
    ids, mask, lengths = _probe_batch(runner)
    gaps = []
    with torch.inference_mode():
        eager_hidden = runner.encoder(ids, mask, None)
        fast_hidden = packed.hidden(ids, lengths, None)
        pairs = [(runner.numpy(packed.pooled(fast_hidden, lengths, runner.pooling)),
                  runner.numpy(pool(eager_hidden, mask, runner.pooling)))]
        if runner.head is not None and packed.classifier is not None:
            pairs.append((runner.numpy(packed.logits(fast_hidden)), runner.numpy(runner.head(eager_hidden))))
    for got, want in pairs:
        if not np.isfinite(got).all():
            return float("inf")
        gaps.append(float(np.abs(got - want).max()) / max(1.0, float(np.abs(want).max())))
    return max(gaps)


def time_linears(runner: EncoderRunner, packed: PackedEncoder, sizes: Sequence[int],
                 clock: Callable[[], float] = time.perf_counter) -> list[KernelTiming]:
    """Seconds of one layer's linears (+ activation) at each row count, eager vs packed,
    interleaved (ABBA), the fastest of several runs each: on a shared machine other processes
    only ever add time, so the minimum is the steadiest estimate of what a kernel costs.
    Stops after the first size where the packed copies do not win (the plan ends there)."""
    layer, fast = runner.encoder.layers[0], packed.layers[0]
    hidden, inner = layer.qkv.in_features, layer.ffn_out.in_features
    gen = torch.Generator().manual_seed(0)

    def eager(x: torch.Tensor, f: torch.Tensor) -> None:
        layer.qkv(x), layer.attn_out(x), layer.act(layer.ffn_in(x)), layer.ffn_out(f)

    def packed_run(x: torch.Tensor, f: torch.Tensor) -> None:
        fast.qkv(x), fast.attn_out(x), fast.ffn_in(x), fast.ffn_out(f)

    out: list[KernelTiming] = []
    with torch.inference_mode():
        for rows in sizes:
            x, f = torch.randn(rows, hidden, generator=gen), torch.randn(rows, inner, generator=gen)
            eager(x, f), packed_run(x, f)  # warm both (oneDNN builds its primitive for this shape)
            reps = max(3, min(15, 8192 // rows))
            times: dict[int, list[float]] = {0: [], 1: []}
            for rep in range(reps):
                for which in ((0, 1) if rep % 2 == 0 else (1, 0)):
                    start = clock()
                    (eager if which == 0 else packed_run)(x, f)
                    times[which].append(clock() - start)
            timing = KernelTiming(rows, min(times[0]), min(times[1]))
            out.append(timing)
            if timing.speedup < DEFAULT_MIN_SPEEDUP:  # the plan stops here: larger sizes cannot count
                break
    return out


def timed_sizes(largest: int) -> list[int]:
    """Row counts to time: the doubling grid, each moved to the middle of its bucket's padding
    (a power of two plus about 1/32) so the timing pays the padding an average forward pays."""
    sizes = []
    for size in timing_grid(largest):
        mid = size + size // 32 + 1
        sizes.append(mid if bucket_rows(mid) != mid and mid <= largest else size)
    return sizes


def _eager(runner: EncoderRunner, reason: str, progress: Progress) -> NativeEncoder:
    progress(f"load: linear kernels eager ({reason})")
    return NativeEncoder(runner, kernels={"linear": "eager", "reason": reason})


def native_encoder(runner: EncoderRunner, device: str, progress: Progress, *, largest_forward_tokens: int = 4096,
                   env: Mapping[str, str] = os.environ) -> NativeEncoder:
    """The native engine for RUNNER, with the oneDNN fast path where it is safe and faster (module doc)."""
    if env.get(ENV, "").strip().lower() in ("0", "off", "false", "no"):
        return _eager(runner, f"turned off ({ENV}={env[ENV]})", progress)
    dtype = next(runner.encoder.parameters()).dtype
    unsupported = onednn_unsupported(device, dtype)
    if unsupported:
        return _eager(runner, unsupported, progress)
    try:
        packed = PackedEncoder(runner.encoder, runner.head)
        gap = numerics_gap(runner, packed)
    except (RuntimeError, ValueError) as exc:  # an op oneDNN refuses for this model's shapes
        log.warning("oneDNN packing failed", exc_info=True)
        return _eager(runner, f"packing failed: {exc}"[:200], progress)
    if not gap <= NUMERICS_TOL:
        return _eager(runner, f"packed answers differ from eager by {gap:.1e} (> {NUMERICS_TOL:g})", progress)
    timings = time_linears(runner, packed, timed_sizes(largest_forward_tokens))
    plan = plan_kernels(timings)
    speedups = [[t.tokens, round(t.speedup, 2)] for t in timings]
    if not plan.enabled:
        kernels = {"linear": "eager", "reason": "the packed copies were not faster at any measured size",
                   "speedups": speedups}
        progress(f"load: linear kernels eager (packed not faster: {speedups})")
        return NativeEncoder(runner, kernels=kernels)
    kernels = {"linear": "onednn_packed", "fused_activation": packed.fused_activation,
               "packed_up_to_tokens": plan.fast_up_to, "numerics_gap": float(f"{gap:.1e}"),
               "reason": f"answers within {NUMERICS_TOL:g} of eager and faster up to {plan.fast_up_to} tokens "
                         f"(eager beyond)", "speedups": speedups}
    progress(f"load: linear kernels oneDNN packed up to {plan.fast_up_to} tokens (speedups {speedups})")
    return NativeEncoder(runner, packed, plan, kernels)
