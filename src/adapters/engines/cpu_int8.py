"""Int8 linears for int8 packages (`vllm-srun quantize`, R-DT-4) on x86 CPUs with VNNI or AMX.

An int8 package's encoder blocks hold int8 weights with one scale per output channel
(`models/quantize.py`); the loader rebuilds float weights `q × scale` for the reference forward.
Here every block's four linears (`LayerLinears`: Q/K/V, attention output, feed-forward in with its
activation, feed-forward out) run as int8 GEMMs on those same int8 values, taken back from the
dequantized weights and checked bit for bit (`quantize.int8_grid`); attention, norms, embeddings,
pooling and the head stay FP32, on the unpadded forward's own ops (`models/unpadded.py`).

One linear, for X [M, in]:
1. each token (row) is quantized on its own, asymmetric: its range [min(x, 0), max(x, 0)] onto
   uint8 0..253 with a zero point (`quantize_tokens`; per-token scales, computed every call);
2. oneDNN's u8 × s8 → s32 GEMM (`torch.ops.onednn.qlinear_pointwise`, its kernel picked for the
   CPU: VNNI `vpdpbusd` here, AMX untested), on the weights reordered once at load
   (`qlinear_prepack`), output in FP32 with the per-channel weight scales applied;
3. `y = (acc − zero ⊗ Σ_k W[:, k]) × step + bias` (the zero point's share removed as a rank-1
   update), then the activation for the feed-forward's first linear.
Steps 1 and 3 are one pass each in a C++ op built once per machine (`int8_kernels.py`), else the
same arithmetic in torch ops (`quantize_tokens`, `finish_rows`): the same bits either way. With the
C++ op, BERT-shaped packages (BERT, RoBERTa / XLM-RoBERTa, DistilBERT) run every forward whole in
one call of `srun_cpu::encode` (`cpu_op_library.py`: the same linears, attention and norms in the
layer loop's order, so the same hidden states, and no GIL taken in it); cls and mean are pooled in
the call, the other outputs read its hidden states.
Every row's answer depends on its own tokens only (integer accumulation is exact, the rest is
element by element), whatever the forward holds; the load-time probe still decides `exact`.
The GEMM's rows are padded to a bucket (`domain.worker.kernels.bucket_rows`, zero rows of uint8) so
oneDNN builds one primitive per bucket, not per forward (each build costs time:
docs/performance.md).

Why these kernels (docs/quantization.md; the figures: docs/performance.md): per-token *asymmetric*
activations keep every bench text of MiniLM within cosine 0.99 of FP32 where per-token symmetric
ones did not (one-word texts: the LayerNorm outputs that feed Q/K/V are lopsided);
`torch._int_mm` (s8 × s8) was no faster and fbgemm's dynamic linear (one activation scale per
tensor) less accurate; oneDNN's u8 GEMM is faster than its FP32 GEMM on MiniLM's shapes.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from vllm_srun.adapters.contracts import Determinism, Device
from vllm_srun.adapters.engines.encoder_engine import NativeEncoder
from vllm_srun.adapters.engines.int8_kernels import load_int8_kernels
from vllm_srun.adapters.models.encoder_arch import EncoderBlock
from vllm_srun.adapters.models.quantize import QUANT_METHOD, dequantize_rows, int8_grid, quantize_rows
from vllm_srun.adapters.models.reference_encoder import ReferenceEncoder
from vllm_srun.adapters.models.unpadded import EAGER_OPS, ForwardOps, LayerLinears
from vllm_srun.domain.worker.kernels import bucket_rows

INT8_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})  # /proc/cpuinfo names of int8 dot products
LEVELS = 253  # a token's range maps onto 0..253 (+ rounding stays within uint8, no clamp needed)
TINY = 1e-30  # the step of an all-zero row (its codes are all 0: the answer is the bias)
WARM_UP_TO = 64  # GEMM primitives built at load for forwards of up to this many token rows
Progress = Callable[[str], None]
CpuOps = Callable[[], tuple[ForwardOps, str]]  # the forward's attention ops, and what the card says of them
ONE_CALL_CARD = (
    "every BERT-shaped layer on its int8 linears in one C++ call, with the embeddings and the pooling "
    "(no GIL taken in it)"
)
ACTIVATIONS_CARD = "dynamic asymmetric per token (uint8, scale and zero point per row, every call)"


def int8_unsupported(
    device_kind: str, dtype: torch.dtype, flags: frozenset[str] | None = None, machine: str | None = None
) -> str | None:
    """Why an int8 package cannot run here (one line), or None. FLAGS: the CPU's feature flags
    (default /proc/cpuinfo's); MACHINE: `platform.machine()`'s."""
    if device_kind != "cpu":
        return (
            f"int8 packages run on x86 CPUs with VNNI or AMX only (device {device_kind}); serve the FP32 package there"
        )
    machine = machine or platform.machine()
    if machine.lower() not in ("x86_64", "amd64", "i686", "x86"):
        return f"int8 packages need an x86 CPU with VNNI or AMX ({machine} is not x86)"
    if flags is None:
        from vllm_srun.adapters.devices.cpu_features import cpu_flags

        flags = cpu_flags()
    if not flags & INT8_FLAGS:
        return f"this CPU has no int8 dot-product instructions ({', '.join(sorted(INT8_FLAGS))}): int8 packages need VNNI or AMX"
    if dtype != torch.float32:
        return (
            f"an int8 package computes around its int8 linears in float32 (asked: {str(dtype).removeprefix('torch.')})"
        )
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.onednn, "qlinear_pointwise"):
        return "this torch build has no oneDNN int8 linear (torch.ops.onednn.qlinear_pointwise)"
    try:  # feature gate: the op gives the reference answer on a small layer
        gen = torch.Generator().manual_seed(0)
        layer = nn.Linear(64, 16).requires_grad_(False)
        with torch.no_grad():
            layer.weight.copy_(dequantize_rows(*quantize_rows(torch.randn(16, 64, generator=gen))))
        x = torch.randn(5, 64, generator=gen)
        got = Int8Linear(layer)(x)
        want = layer(x)
        if not torch.allclose(got, want, atol=0.05 * float(want.abs().max()), rtol=0):
            return "oneDNN's int8 linear disagrees with the FP32 linear on a test layer"
    except (RuntimeError, AttributeError, ValueError) as exc:
        return f"oneDNN int8 linears are unavailable: {exc}"[:200]
    return None


def quantize_tokens(x: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """X [M, K] float32 → (codes uint8 [ROWS, K], step [M, 1], zero [M, 1]) with x ≈ (codes − zero) × step,
    row by row: the row's range [min(x, 0), max(x, 0)] onto 0..LEVELS (0 stays exactly 0); rows past M
    are zero codes (the GEMM's bucket). In torch ops: `csrc/int8_rows.cpp` does the same in one pass."""
    hi = x.amax(1, keepdim=True).clamp_(min=0)
    lo = x.amin(1, keepdim=True).clamp_(max=0)
    step = hi.sub_(lo).clamp_(min=TINY).div_(LEVELS)
    inv = step.reciprocal()
    zero = lo.mul_(inv).neg_().ceil_()  # x·inv + zero ∈ [0, LEVELS + 1): +0.5 and truncation round it
    codes = (x * inv).add_(zero + 0.5).to(torch.uint8)
    if rows > codes.shape[0]:
        codes = torch.cat([codes, codes.new_zeros(rows - codes.shape[0], codes.shape[1])])
    return codes, step, zero


def finish_rows(
    acc: torch.Tensor, zero: torch.Tensor, step: torch.Tensor, column_sums: torch.Tensor, bias: torch.Tensor
) -> None:
    """In place on ACC's first M rows (M = zero's): `(acc − zero ⊗ column_sums) × step + bias`."""
    y = acc[: zero.shape[0]]
    y.sub_(zero * column_sums).mul_(step).add_(bias)


class RowSteps:
    """How a linear quantizes its input and finishes its output: the C++ op or torch ops."""

    def __init__(self, native: bool) -> None:
        self.native = native
        self.name = "one pass each (C++ op)" if native else "torch ops"

    def quantize(self, x: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.native:
            return torch.ops.srun_int8.quantize_tokens(x.contiguous(), rows)
        return quantize_tokens(x, rows)

    def finish(
        self, acc: torch.Tensor, zero: torch.Tensor, step: torch.Tensor, column_sums: torch.Tensor, bias: torch.Tensor
    ) -> None:
        if self.native:
            torch.ops.srun_int8.finish_rows(acc, zero, step, column_sums, bias)
        else:
            finish_rows(acc, zero, step, column_sums, bias)


TORCH_STEPS = RowSteps(native=False)


class Int8Linear:
    """`act(x Wᵀ + b)` with W int8 per output channel (exactly the weight it is built from, which
    must be `q × scale`) and x quantized per token at every call."""

    __slots__ = ("act", "bias", "column_sums", "in_features", "out_features", "scale", "steps", "weight", "zeros")

    def __init__(
        self,
        linear: nn.Linear,
        act: Callable[[torch.Tensor], torch.Tensor] | None = None,
        steps: RowSteps = TORCH_STEPS,
    ) -> None:
        grid = int8_grid(linear.weight)
        if grid is None:
            raise ValueError("a block weight is not int8 × per-row scale (not the weights of an int8 package)")
        q, scale = grid
        self.weight = torch.ops.onednn.qlinear_prepack(q, None)
        self.scale = scale
        self.zeros = torch.zeros(q.shape[0], dtype=torch.int32)
        self.column_sums = q.to(torch.float32).sum(1) * scale  # Σ_k W[n, k]: the zero point's share per unit
        bias = linear.bias
        self.bias = bias.detach().to(torch.float32) if bias is not None else torch.zeros(q.shape[0])
        self.out_features, self.in_features = q.shape
        self.act = act
        self.steps = steps

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """[M, in] float32 → [M, out] float32."""
        rows = x.shape[0]
        # zero codes up to a bucket of rows: one GEMM primitive per bucket, not per forward
        codes, step, zero = self.steps.quantize(x, bucket_rows(rows))
        acc = torch.ops.onednn.qlinear_pointwise(
            codes, 1.0, 0, self.weight, self.scale, self.zeros, None, 1.0, 0, torch.float32, "none", [], ""
        )
        self.steps.finish(acc, zero, step, self.column_sums, self.bias)
        y = acc[:rows]
        return y if self.act is None else self.act(y)


def int8_linears(blocks: Sequence[EncoderBlock], steps: RowSteps = TORCH_STEPS) -> list[LayerLinears]:
    """Every block's four linears as int8 linears (ValueError: a block's weights are not int8's)."""
    out = []
    for i, block in enumerate(blocks):
        try:
            out.append(
                LayerLinears(
                    Int8Linear(block.qkv, steps=steps),
                    Int8Linear(block.attn_out, steps=steps),
                    Int8Linear(block.ffn_in, block.activate, steps),
                    Int8Linear(block.ffn_out, steps=steps),
                )
            )
        except ValueError as exc:
            raise ValueError(f"block {i}: {exc}") from None
    return out


class Int8Encoder(NativeEncoder):
    """The native engine with every forward's block linears on int8 GEMMs (any forward size)."""

    def __init__(
        self,
        reference: ReferenceEncoder,
        linears: list[LayerLinears],
        kernels: dict[str, Any],
        quantization: dict[str, Any],
        ops: ForwardOps = EAGER_OPS,
    ) -> None:
        super().__init__(reference, kernels=kernels, ops=ops)  # OPS: the FP32 forward's attention and norms
        self.int8 = linears
        self.quantization = quantization

    @property
    def kernel_switch_tokens(self) -> int | None:
        return None  # the same kernels at every forward size

    @property
    def determinism(self) -> Determinism:
        """Each row's answer depends on its own tokens only (module doc): rows may share forwards."""
        return Determinism.BATCH_INVARIANT

    def linears_for(self, tokens: int) -> list[LayerLinears]:
        return self.int8

    @property
    def one_call_linears(self) -> list[LayerLinears]:
        return self.int8  # `srun_cpu::encode` runs them where the row steps are the C++ op's

    def describe(self) -> dict[str, Any]:
        return {"kernels": dict(self.kernels), "quantization": dict(self.quantization)}

    def warm(self, up_to_rows: int = WARM_UP_TO) -> None:
        """Build oneDNN's GEMM primitives for every bucket of token rows up to UP_TO_ROWS."""
        first = self.int8[0]
        linears = [first.qkv, first.attn_out, first.ffn_in_act, first.ffn_out]
        with torch.inference_mode():
            for rows in sorted({bucket_rows(n) for n in range(1, max(2, up_to_rows) + 1)}):
                for linear in linears:
                    assert isinstance(linear, Int8Linear)
                    linear(torch.zeros(rows, linear.in_features))


def int8_encoder(
    reference: ReferenceEncoder,
    device: Device,
    progress: Progress,
    *,
    cpu_ops: CpuOps | None = None,
    flags: frozenset[str] | None = None,
    env: Mapping[str, str] = os.environ,
) -> Int8Encoder:
    """The engine of an int8 package: int8 linears on a CPU with VNNI or AMX, else EngineRefused in
    one line (a GPU, another CPU, a dtype other than float32). CPU_OPS gives the forward's
    attention ops (the FP32 path's: `cpu_op_library.cpu_ops`), called once the package is accepted;
    the per-token steps run on the C++ op where it builds (`int8_kernels.py`), else on torch ops."""
    from vllm_srun.adapters.contracts import EngineRefused

    assert reference.quantization is not None
    dtype = next(reference.encoder.parameters()).dtype
    refusal = int8_unsupported(device.kind, dtype, flags)
    if refusal:
        raise EngineRefused(refusal)
    why = load_int8_kernels(progress, env)
    steps = RowSteps(native=why is None)
    try:
        linears = int8_linears(reference.encoder.blocks, steps)
    except ValueError as exc:
        raise EngineRefused(f"int8 package: {exc}") from None
    ops, attention = cpu_ops() if cpu_ops is not None else (EAGER_OPS, "sdpa per run of equal-length rows")
    one_call = ops.runs_whole(reference.encoder, linears)  # built here, not at the first forward
    kernels = {
        "linear": "int8 (oneDNN u8 x s8 -> s32 GEMM)",
        "weights": "int8, one scale per output channel",
        "activations": ACTIVATIONS_CARD,
        "row_steps": steps.name + (f" ({why})" if why else ""),
        "attention": attention,
        "add_norm": ops.norm_card,
        "layers": ONE_CALL_CARD if one_call else EAGER_OPS.layers_card,
        "reason": f"{QUANT_METHOD} package: its block linears run int8 at every forward size",
    }
    quantization = {
        "method": QUANT_METHOD,
        "bits": 8,
        "weights": "symmetric per output channel",
        "activations": "dynamic per-token (asymmetric uint8)",
        "int8_modules": "encoder block linears (Q/K/V, attention output, feed-forward in and out)",
        "fp32_modules": "embeddings, norms, biases, attention, pooling, heads",
    }
    engine = Int8Encoder(reference, linears, kernels, quantization, ops)
    engine.warm()
    progress(f"load: linear kernels int8 ({len(linears)} blocks, activations {ACTIVATIONS_CARD})")
    return engine
