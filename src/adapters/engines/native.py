"""The native (torch) engine for encoders, with the oneDNN fast path where it is measured to help.

`native_encoder(reference, device, progress)` decides, once at load on the device thread, which
`NativeEncoder` (`encoder_engine.py`) an encoder gets (an int8 package: `cpu_int8.py`'s
`Int8Encoder`, or a refusal). For any other package:
1. gate: `VLLM_SRUN_ONEDNN=0` turns the fast path off (A/B; `=1` puts every forward on it,
   skipping step 3); otherwise it needs an x86 CPU, oneDNN and FP32 weights
   (`cpu_onednn.onednn_unsupported`);
2. numerics: the packed forward must give the eager forward's answers (pooled embeddings,
   logits) on a ragged probe batch within `NUMERICS_TOL` (relative to the answers' size);
3. speed: one layer's linears timed on both paths over a grid of row counts (`onednn_timing`,
   cached per machine), turned into a `KernelPlan` by `domain.worker.kernels.plan_kernels`: the packed
   copies serve forwards up to the largest size where they were not slower at every size
   measured (and won at the small ones), or up to 512 tokens where they stayed within 10 % of
   eager that far (batch invariance, R-BAT-5), eager the rest.
The card reports the outcome as `kernels: {linear: onednn_packed|eager, reason, ...}`. The
readiness check and the probe run after this, through `forward` (its `embed` / `classify_logits`): the path that serves.

On a GPU the same unpadded forward runs on the device (rows laid back to back, every index tensor
placed there), and the fused Triton kernels (`triton_encoder.py`: bias+GELU, residual+LayerNorm, the
variable-length attention) serve the forward sizes where load-time timings found them faster; the
card says so under `kernels.triton`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vllm_srun.adapters.contracts import Device
from vllm_srun.adapters.engines.cpu_onednn import ENV, PackedEncoder, onednn_mode, onednn_unsupported
from vllm_srun.adapters.engines.cpu_op_library import cpu_ops
from vllm_srun.adapters.engines.encoder_engine import FORCED_UP_TO, NativeEncoder
from vllm_srun.adapters.engines.onednn_timing import measure
from vllm_srun.adapters.engines.triton_encoder import encoder_kernels
from vllm_srun.adapters.models.encoder_arch import EncoderModule
from vllm_srun.adapters.models.pooling import pool
from vllm_srun.adapters.models.qwen3_5_kernels import TORCH_KERNELS
from vllm_srun.adapters.models.reference_encoder import ReferenceEncoder
from vllm_srun.adapters.models.tokenization import Encoded
from vllm_srun.adapters.models.unpadded import EAGER_OPS, ForwardOps
from vllm_srun.domain.scheduling.planning import BATCH_INVARIANT_TOKENS
from vllm_srun.domain.worker.kernels import DEFAULT_TIE, KernelPlan, plan_kernels

log = logging.getLogger("vllm_srun.engines.native")
NUMERICS_TOL = 1e-5
# BF16 answers on two kernel sets differ by BF16 rounding (8 bits of mantissa), not by 1e-5
NUMERICS_TOL_BY_DTYPE = {torch.float32: NUMERICS_TOL, torch.bfloat16: 3e-2}
WARM_UP_TO = 64  # oneDNN primitives built at load for forwards of up to this many token rows
Progress = Callable[[str], None]


def _probe_batch(reference: ReferenceEncoder) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """A ragged batch of pseudo-random ids (longest first), deterministic, within the model's positions."""
    gen = torch.Generator().manual_seed(1234)
    top = max(2, min(reference.config.max_tokens, 64))
    lengths = sorted({min(top, n) for n in (top, 33, 17, 17, 5, 2)}, reverse=True)
    lengths = sorted([*lengths, lengths[-1]], reverse=True)  # a run of two equal rows
    ids = torch.randint(0, reference.config.vocab_size, (len(lengths), lengths[0]), generator=gen)
    mask = torch.arange(lengths[0])[None, :] < torch.tensor(lengths)[:, None]
    ids = ids.masked_fill(~mask, reference.pad_id)
    return ids, mask, lengths


def layers_card(encoder: EncoderModule, packed: PackedEncoder, ops: ForwardOps) -> str:
    """What the card says of how a forward on the packed copies runs ENCODER's layers: BERT-shaped
    ones through `ForwardOps.layers`, a named stack (`one_call_stack`) through `ForwardOps.stack`
    where the ops run it for these linears, else the Python loop."""
    if encoder.asks_for_layers:
        return ops.layers_card
    if encoder.one_call_stack and ops.runs_stack(encoder, packed.layer_linears):
        return ops.stack_card
    return EAGER_OPS.layers_card


def numerics_gap(reference: ReferenceEncoder, packed: PackedEncoder, ops: ForwardOps = EAGER_OPS) -> float:
    """Largest |packed − eager| over the answers of a probe batch, relative to their size: the
    serving forward on the packed copies (`NativeEncoder` with every forward on them, attention
    on OPS) against the reference (the padded eager forward)."""
    ids, mask, lengths = _probe_batch(reference)
    batch = [Encoded(ids[i, :n].tolist(), [0] * n, False, n) for i, n in enumerate(lengths)]
    serving = NativeEncoder(reference, packed, KernelPlan(FORCED_UP_TO), ops=ops)
    gaps = []
    with torch.inference_mode():
        eager_hidden = reference.encoder(ids, mask, None)
        pairs = [(serving.embed(batch), reference.numpy(pool(eager_hidden, mask, reference.pooling)))]
        if reference.head is not None:
            pairs.append((serving.classify_logits(batch), reference.numpy(reference.head(eager_hidden, mask))))
    for got, want in pairs:
        if not np.isfinite(got).all():
            return float("inf")
        gaps.append(float(np.abs(got - want).max()) / max(1.0, float(np.abs(want).max())))
    return max(gaps)


def _eager(
    reference: ReferenceEncoder, reason: str, progress: Progress, ops: ForwardOps = EAGER_OPS, attention: str = ""
) -> NativeEncoder:
    progress(f"load: linear kernels eager ({reason})")
    card = {"linear": "eager", "reason": reason} | (
        {"attention": attention, "add_norm": ops.norm_card} if attention else {}
    )
    if reference.encoder.hybrid_backbone:  # Qwen3.5: its own layers and kernels
        kernels = ops.hybrid_kernels() or TORCH_KERNELS
        card = {"linear": "eager", "reason": reason, "attention": "torch sdpa per group of rows of one length"}
        card |= kernels.card()
    return NativeEncoder(reference, kernels=card, ops=ops)


def gpu_encoder(
    reference: ReferenceEncoder, device: Device, progress: Progress, env: Mapping[str, str]
) -> NativeEncoder:
    """The native engine on a GPU: the unpadded forward, with the fused Triton kernels where they
    passed their check and were measured faster (`triton_encoder.py`)."""
    found = encoder_kernels(reference, device, progress, env)
    base = {"linear": "eager", "attention": "sdpa per run of equal-length rows"}
    if isinstance(found, str):
        progress(f"load: eager kernels on {device.name} ({found})")
        return NativeEncoder(reference, kernels={**base, "triton": None, "reason": found})
    progress(f"load: Triton kernels on {device.name}: {found.card()}")
    return NativeEncoder(
        reference, kernels={**base, "triton": found.card(), "reason": "Triton where faster"}, gpu=found
    )


def native_encoder(
    reference: ReferenceEncoder,
    device: Device,
    progress: Progress,
    *,
    largest_forward_tokens: int = 4096,
    cache_dir: Path | None = None,
    env: Mapping[str, str] = os.environ,
    deterministic: bool = False,
    prefer_invariant: bool = False,
) -> NativeEncoder:
    """The native engine for REFERENCE, with the oneDNN fast path where it is safe and faster
    (module doc), or on a GPU the fused Triton kernels where they are faster. DETERMINISTIC
    (`--deterministic`): on a CPU the packed copies serve every forward where they can (they are
    batch-invariant), whatever the timings say; PREFER_INVARIANT (a profile that never coalesces,
    R-PROF-1) asks the same, so that the probe finds the model batch-invariant and rows still merge."""
    # ---- int8 packages (`vllm-srun quantize`): int8 linears on a CPU with VNNI/AMX, else refused in one line
    if reference.quantization is not None:
        from vllm_srun.adapters.engines.cpu_int8 import int8_encoder

        return int8_encoder(reference, device, progress, cpu_ops=lambda: cpu_ops(torch.float32, progress, env), env=env)
    # ---- end of the int8 branch
    if device.kind != "cpu":
        return gpu_encoder(reference, device, progress, env)
    mode = onednn_mode(env)
    if (deterministic or prefer_invariant) and mode == "auto":
        mode = "force"
    dtype = next(reference.encoder.parameters()).dtype
    ops, attention = cpu_ops(dtype, progress, env)
    if mode == "off":
        return _eager(reference, f"turned off ({ENV}={env[ENV]})", progress, ops, attention)
    unsupported = onednn_unsupported(device.name, dtype)
    if unsupported is None and not list(reference.encoder.blocks):
        unsupported = f"a {reference.config.model_type} model has no four-linear blocks to pack"
    if unsupported:
        return _eager(reference, unsupported, progress, ops, attention)
    try:
        packed = PackedEncoder(reference.encoder, reference.head)
        gap = numerics_gap(reference, packed, ops)
    except (RuntimeError, ValueError) as exc:  # an op oneDNN refuses for this model's shapes
        log.warning("oneDNN packing failed", exc_info=True)
        return _eager(reference, f"packing failed: {exc}"[:200], progress, ops, attention)
    tol = NUMERICS_TOL_BY_DTYPE.get(dtype, NUMERICS_TOL)
    if not gap <= tol:
        why = f"packed answers differ from eager by {gap:.1e} (> {tol:g})"
        return _eager(reference, why, progress, ops, attention)
    kernels: dict[str, Any] = {
        "attention": attention,
        "add_norm": ops.norm_card,
        "layers": layers_card(reference.encoder, packed, ops),
        "linear": "onednn_packed",
        "dtype": str(dtype).removeprefix("torch."),
        "fused_activation": packed.fused_activation,
        "numerics_gap": float(f"{gap:.1e}"),
    }
    if mode == "force":
        plan = KernelPlan(FORCED_UP_TO)
        if ENV in env:
            why = f"{ENV}={env[ENV]}"
        else:
            why = "--deterministic" if deterministic else "the exact profile: batch-invariant kernels"
        kernels.update(
            packed_up_to_tokens=None,
            reason=f"every forward ({why}); answers within {tol:g} of eager",
        )
        progress(f"load: linear kernels oneDNN packed for every forward ({why})")
        packed.warm(WARM_UP_TO)
        return NativeEncoder(reference, packed, plan, kernels, ops=ops)
    timings, source = measure(reference, packed, largest_forward_tokens, cache_dir, progress)
    plan = plan_kernels(timings, exact_tokens=BATCH_INVARIANT_TOKENS)
    speedups = [[t.tokens, round(t.speedup, 2)] for t in timings]
    if not plan.enabled:
        progress(f"load: linear kernels eager (packed not faster: {speedups})")
        return NativeEncoder(
            reference,
            kernels={
                "attention": attention,
                "add_norm": ops.norm_card,
                "linear": "eager",
                "reason": "the packed copies were not faster at the smallest measured size",
                "speedups": speedups,
                "timings": source,
            },
            ops=ops,
        )
    faster = plan_kernels(timings).fast_up_to
    tie = (
        f"; within {1 - DEFAULT_TIE:.0%} of eager from {faster} to {plan.fast_up_to}, kept for batch invariance"
        if faster < plan.fast_up_to
        else ""
    )
    kernels.update(
        packed_up_to_tokens=plan.fast_up_to,
        speedups=speedups,
        timings=source,
        reason=f"answers within {tol:g} of eager; faster up to {faster} tokens{tie}; eager beyond {plan.fast_up_to}",
    )
    progress(f"load: linear kernels oneDNN packed up to {plan.fast_up_to} tokens ({source} speedups {speedups})")
    packed.warm(min(plan.fast_up_to, WARM_UP_TO))
    return NativeEncoder(reference, packed, plan, kernels, ops=ops)
