"""The CPU forward's C++ op library (`srun_cpu`, the sources in `csrc/`): built and loaded here, and
the Python side of every op in it. First the unpadded forward's own ops (R-BAT-2's packed
forward): attention of every row in one call, and each residual add + LayerNorm in one pass.

The eager ops (`models/unpadded.ForwardOps`) run one SDPA per run of equal-length rows: a merged
forward of short texts makes dozens of calls per layer, each paying torch's dispatch and the flash
kernel's set-up, and with a head size of 32 the flash kernel's blocking does little.
`csrc/cpu_forward.cpp` holds one op for the whole forward: one task per (row, head), spread over the
forward's OpenMP team (`at::parallel_for`), each computed the same way whatever else the forward
holds and whichever thread runs it, so a row's answer depends on its own tokens only (batch- and
thread-count-invariant by construction; the load-time probe still decides `exact`). Each task scores
16 queries at once (32 while two blocks are left): every key's scores for the block fill one vector,
so the softmax runs down columns with no horizontal sums, and keys are read in place.
`bench/varlen_attention.py` times the op against the per-run SDPA and `bench/packed_forward.py`
whole forwards (their figures: docs/performance.md). Head sizes that are not a whole number of 16
floats keep SDPA (head size 8 was slower on this op). `varlen_attention_biased` is the same op with
a score bias that depends on the distance query − key only (`unpadded.RelativeBias`: MPNet's
relative positions, ModernBERT's sliding windows, a decoder's causal mask): for one key its 16
queries' biases are 16 consecutive floats of the head's table, one load added to the scores before
the softmax. `varlen_attention_disentangled` adds DeBERTa's two position terms
(`unpadded.DisentangledTables`): with the layer's relative keys and queries laid out by distance,
[heads, head_dim, distance], a key's c2p terms for the block are the block's queries times 16
consecutive floats of each dimension's row, and its p2c terms the key times 16 more, two more
multiply-adds per dimension beside q · k, where the per-run path multiplied every query and key by
every relative row and gathered the [L, L] scores it needed.

`add_norm` (twice per block) adds the residual into the linear's fresh output and normalises each
row in the same pass, over 16 lanes in a fixed order (a row's bits are its own, on any thread
count), ≤ 2e-6 from eager's `x + r` then `LayerNorm` (its time against eager's:
docs/performance.md). Norms without a bias (ModernBERT), other dtypes and other shapes keep eager.
oneDNN's own fusion of the residual into the linear (`_linear_pointwise.binary` "add") was measured
slower than the packed linear then `+` (docs/performance.md).

`encoder_layers` runs every layer of a BERT-shaped encoder in one call, and `encode` the whole
forward (the embeddings, those layers, then cls or mean pooling and the L2 norm, or the hidden
states every other output reads: `NativeEncoder._hidden`) for BERT, RoBERTa / XLM-RoBERTa,
DistilBERT and MPNet packages (MPNet's relative position bias is a distance table for the model's
longest row, built once and held with the weights) on the packed linears, or on an int8 package's linears (`int8_layers`:
`cpu_int8.Int8Linear`'s steps, the int8 row op and oneDNN's u8 x s8 GEMM called from C++, in the
layer loop's order). Its arguments are plain integer lists and the weights are held by C++
(`EncoderWeights`, built at the first forward): a tensor passed from Python would cost a GIL take
when the op drops it, and beside a busy event loop each take waits up to a switch interval, so the
call takes the GIL nowhere (`bench/forward_beside_loop.py`). Decoder backbones, ModernBERT and
DeBERTa run every layer in one call of their own stacks (`stack`, engines/cpu_stacks.py,
`csrc/cpu_stacks.cpp`, built into the same library), and the Qwen3.5 backbone its Gated DeltaNet
steps and every layer on the C++ kernels of `hybrid_kernels` (engines/cpu_hybrid.py,
`csrc/gated_delta.cpp`, `csrc/qwen3_5_layers.cpp`, the same library).

The ops are compiled once per machine at load into the kernel cache (`engines/cpp_ops.py`). A
machine without a C++ compiler, a failed build, `VLLM_SRUN_CPU_ATTENTION=0`, a dtype other than
FP32 or a head size without a kernel keep the per-run SDPA, said in one line at load.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from vllm_srun.adapters.engines.cpp_ops import CppOp
from vllm_srun.adapters.engines.cpu_hybrid import CppHybridKernels
from vllm_srun.adapters.engines.cpu_layer_params import int8_layer_params, layer_params
from vllm_srun.adapters.models.encoder_arch import EncoderModule
from vllm_srun.adapters.models.qwen3_5_kernels import TORCH_KERNELS, HybridKernels
from vllm_srun.adapters.models.tokenization import Encoded
from vllm_srun.adapters.models.unpadded import (
    EAGER_OPS,
    POOLINGS,
    DisentangledTables,
    EmbeddingTables,
    ForwardOps,
    LayerLinears,
    PackedRows,
    RelativeBias,
)
from vllm_srun.domain.worker.kernels import bucket_rows

ENV = "VLLM_SRUN_CPU_ATTENTION"
OP = CppOp(
    "cpu_forward.cpp",
    "CPU forward ops (one-call attention, add + LayerNorm)",
    ENV,
    ("srun_cpu", "decoder_layers"),
    flags=("-fno-trapping-math",),
    also=("cpu_stacks.cpp", "gated_delta.cpp", "qwen3_5_layers.cpp"),
)
Progress = Callable[[str], None]


def load_varlen_attention(progress: Progress, env: Mapping[str, str] = os.environ) -> str | None:
    """Build (once per machine) and load the op; None when it is loaded, else why not (one line)."""
    return OP.load(progress, env)


class VarlenOps(ForwardOps):
    """The eager ops with attention in one call for all rows (FP32, head sizes the op has)."""

    name = "cpu_varlen"
    norm_card = "residual add + LayerNorm in one pass (C++ op)"
    layers_card = (
        "every BERT-shaped packed layer in one C++ call, with the embeddings and the pooling (no GIL taken in it)"
    )
    stack_card = "every packed layer and the final norm in one C++ call (no GIL taken in it)"

    def __init__(self) -> None:
        self._dims: dict[int, bool] = {}
        # `_kept` entries: (encoder, linears, what was built for them)
        self._held: dict[tuple[int, int], tuple[Any, Any, Any]] = {}  # `_weights`
        self._stacks: dict[tuple[int, int], tuple[Any, Any, Any]] = {}  # `stack`
        self._hybrid: CppHybridKernels | None = None  # `hybrid_kernels`

    def supports(self, head_dim: int) -> bool:
        if head_dim not in self._dims:
            self._dims[head_dim] = bool(torch.ops.srun_cpu.supports_head_dim(head_dim))
        return self._dims[head_dim]

    def runs_biased(self, head_dim: int, dtype: torch.dtype) -> bool:
        return dtype == torch.float32 and self.supports(head_dim)

    def attention(
        self, qkv: torch.Tensor, packed: PackedRows, heads: int, relative: RelativeBias | None = None
    ) -> torch.Tensor:
        dim = qkv.shape[1] // (3 * heads)
        if qkv.dtype != torch.float32 or qkv.device.type != "cpu" or not self.supports(dim):
            return super().attention(qkv, packed, heads, relative)
        if relative is not None:
            return torch.ops.srun_cpu.varlen_attention_biased(
                qkv.contiguous(), packed.starts, packed.lengths, heads, dim**-0.5, relative.table, relative.centre
            )
        return torch.ops.srun_cpu.varlen_attention(qkv.contiguous(), packed.starts, packed.lengths, heads, dim**-0.5)

    def disentangled_attention(
        self, qkv: torch.Tensor, packed: PackedRows, heads: int, scale: float, tables: DisentangledTables
    ) -> torch.Tensor | None:
        dim = qkv.shape[1] // (3 * heads)
        if not self.runs_biased(dim, qkv.dtype) or qkv.device.type != "cpu":
            return None
        return torch.ops.srun_cpu.varlen_attention_disentangled(
            qkv.contiguous(), packed.starts, packed.lengths, heads, scale, tables.keys, tables.queries, tables.centre
        )

    def add_norm(self, delta: torch.Tensor, residual: torch.Tensor, norm: torch.nn.LayerNorm) -> torch.Tensor:
        """The residual add and the LayerNorm in one pass, written over DELTA (a linear's fresh output)."""
        weight, bias = norm.weight, norm.bias
        if (
            not isinstance(norm, torch.nn.LayerNorm)
            or weight is None
            or bias is None
            or delta.dtype != torch.float32
            or delta.dim() != 2
            or not delta.is_contiguous()
            or not residual.is_contiguous()
            or residual.shape != delta.shape
            or tuple(norm.normalized_shape) != (delta.shape[1],)
        ):
            return super().add_norm(delta, residual, norm)
        return torch.ops.srun_cpu.add_layer_norm_(delta, residual, weight, bias, norm.eps)

    def layers(
        self, x: torch.Tensor, packed: PackedRows, blocks: Sequence[Any], linears: Sequence[LayerLinears]
    ) -> torch.Tensor | None:
        """Every layer in one call of the C++ op (`encoder_layers`: the same kernels in the same
        order as the layer loop, so the same bits), which releases the GIL once for the whole stack
        instead of at every op; None where a layer is not the plain BERT shape it runs."""
        if not _bucket_of_fp32_rows(x):
            return None
        params = layer_params(blocks, linears, x.shape[1], self.supports)
        if params is None:
            return None
        tensors, eps, attr, algorithm, heads, dim = params
        return torch.ops.srun_cpu.encoder_layers(
            x, packed.starts, packed.lengths, tensors, heads, dim**-0.5, eps, attr, algorithm
        )

    def encode(
        self,
        encoder: Any,
        linears: Sequence[LayerLinears],
        batch: Sequence[Encoded],
        rows_total: int,
        pooling: str,
        normalize: bool,
    ) -> torch.Tensor | None:
        """The whole forward in one call of `srun_cpu::encode`: embeddings, `encoder_layers`, pooling.
        Its arguments are plain integer lists and the weights are held by C++ (`EncoderWeights`, built
        once per encoder and linears), so the call takes the GIL nowhere: each tensor argument from
        Python costs a GIL take when the op drops it (measured: a short forward's layers 25 ms alone,
        57 ms beside a busy Python thread with the weights passed as arguments). None where the
        encoder is not BERT-shaped (`embedding_tables`), a layer is not the plain packed shape, or
        ROWS_TOTAL is not a row bucket (the linears' own bits are probed on buckets)."""
        if pooling not in POOLINGS or bucket_rows(rows_total) != rows_total:
            return None
        held = self._weights(encoder, linears)
        if held is None:
            return None
        weights, typed = held
        ids = [token for row in batch for token in row.ids]
        types = [t for row in batch for t in row.type_ids] if typed and any(any(r.type_ids) for r in batch) else []
        lengths = [len(row.ids) for row in batch]
        return torch.ops.srun_cpu.encode(weights, ids, lengths, types, rows_total, POOLINGS.index(pooling), normalize)

    def runs_whole(self, encoder: Any, linears: Sequence[LayerLinears]) -> bool:
        return self._weights(encoder, linears) is not None

    def stack(
        self,
        encoder: Any,
        linears: Sequence[LayerLinears],
        x: torch.Tensor,
        packed: PackedRows,
        inputs: tuple[Any, ...],
    ) -> torch.Tensor | None:
        """Every layer of ENCODER and its final norm in one call of its C++ stack (engines/cpu_stacks.py:
        the layer loop's ops in its order, so the same bits; the weights held by C++, built at the
        first forward); None where ENCODER names no stack, the stack does not run it, or X is not a
        whole row bucket of FP32 rows on the CPU (the packed linears run on buckets)."""
        if not _bucket_of_fp32_rows(x):
            return None
        held = self._stack(encoder, linears)
        return held[0].run(held[1], x, packed, inputs) if held is not None else None

    def runs_stack(self, encoder: Any, linears: Sequence[LayerLinears]) -> bool:
        return self._stack(encoder, linears) is not None

    def hybrid_kernels(self) -> CppHybridKernels:
        """The C++ Gated DeltaNet kernels and Qwen3.5 layer stack (engines/cpu_hybrid.py), built into
        the same library."""
        if self._hybrid is None:
            self._hybrid = CppHybridKernels()
        return self._hybrid

    def _stack(self, encoder: EncoderModule, linears: Sequence[LayerLinears]) -> tuple[Any, Any] | None:
        """ENCODER's stack and its weights on these LINEARS, built at the first call and kept (None
        where it names none or the stack does not run it)."""
        from vllm_srun.adapters.engines.cpu_stacks import STACKS

        stack = STACKS.get(encoder.one_call_stack)
        if stack is None:
            return None
        held = _kept(self._stacks, encoder, linears, lambda: stack.build(encoder, linears, self.supports))
        return (stack, held) if held is not None else None

    def _weights(self, encoder: Any, linears: Sequence[LayerLinears]) -> tuple[Any, bool] | None:
        """ENCODER's `EncoderWeights` with these LINEARS and whether it reads token types (None where
        the op cannot run them), built at the first forward and kept."""
        return _kept(self._held, encoder, linears, lambda: self._build_weights(encoder, linears))

    def _build_weights(self, encoder: EncoderModule, linears: Sequence[LayerLinears]) -> tuple[Any, bool] | None:
        tables: EmbeddingTables | None = encoder.embedding_tables()
        if tables is None:
            return None
        norm = tables.norm
        # no token types: one row of zeros, added as + 0.0 (the same bits as no add)
        types = tables.type if tables.type is not None else tables.word.new_zeros(1, tables.word.shape[1])
        embeddings = [tables.word, tables.position, types, norm.weight, norm.bias]
        if not isinstance(norm, torch.nn.LayerNorm) or any(
            t is None or t.dtype != torch.float32 or t.device.type != "cpu" or not t.is_contiguous() for t in embeddings
        ):
            return None
        hidden = tables.word.shape[1]
        kind = "packed"
        params = layer_params(encoder.blocks, linears, hidden, self.supports)
        if params is None:
            kind = "int8"
            params = int8_layer_params(encoder.blocks, linears, hidden, self.supports)
        if params is None:
            return None
        tensors, eps, attr, algorithm, heads, dim = params
        # every layer's distance bias for the model's longest row (MPNet), held with the weights
        relative: RelativeBias | None = encoder.distance_table()
        if relative is not None and (relative.table.dtype != torch.float32 or relative.table.device.type != "cpu"):
            return None
        weights = torch.classes.srun_cpu.EncoderWeights(
            [t.detach() for t in embeddings],
            float(norm.eps),
            tables.offset,
            kind,
            tensors,
            heads,
            dim**-0.5,
            eps,
            attr,
            algorithm,
            relative.table.detach().contiguous() if relative is not None else torch.empty(0),
            relative.centre if relative is not None else 0,
        )
        return weights, tables.type is not None


def _bucket_of_fp32_rows(x: torch.Tensor) -> bool:
    """Whether X is what the C++ layers run: FP32 rows on the CPU, already padded to a row bucket
    (the loop's packed linears pad to one first)."""
    return (
        x.dtype == torch.float32 and x.device.type == "cpu" and x.dim() == 2 and bucket_rows(x.shape[0]) == x.shape[0]
    )


def _kept(
    cache: dict[tuple[int, int], tuple[Any, Any, Any]], encoder: Any, linears: Any, build: Callable[[], Any]
) -> Any:
    """What BUILD makes for ENCODER and LINEARS, made at the first call and kept in CACHE (None
    included). The entry holds both, so their ids stay theirs while it is there."""
    key = (id(encoder), id(linears))
    entry = cache.get(key)
    if entry is None:
        entry = (encoder, linears, build())
        cache[key] = entry
    return entry[2]


def cpu_ops(dtype: torch.dtype, progress: Progress, env: Mapping[str, str] = os.environ) -> tuple[ForwardOps, str]:
    """The ops a CPU forward in DTYPE runs on, and what the card says of its attention."""
    if dtype != torch.float32:
        return EAGER_OPS, f"sdpa per run of equal-length rows (the one-call op is FP32; this model is {dtype})"
    why = load_varlen_attention(progress, env)
    if why is not None:
        progress(f"load: attention per run of equal-length rows ({why})")
        return EAGER_OPS, f"sdpa per run of equal-length rows ({why})"
    return VarlenOps(), "one call for every row (C++ varlen op)"


def hybrid_kernels(
    dtype: torch.dtype, progress: Progress, env: Mapping[str, str] = os.environ
) -> tuple[HybridKernels, str | None]:
    """The kernels a CPU model in DTYPE runs its Gated DeltaNet layers on, and why not the C++ ones
    (None where it does)."""
    if dtype != torch.float32:
        return TORCH_KERNELS, f"the C++ kernels are FP32; this model is {str(dtype).removeprefix('torch.')}"
    why = load_varlen_attention(progress, env)
    if why is not None:
        progress(f"load: Qwen3.5 layers on torch's kernels ({why})")
        return TORCH_KERNELS, why
    return CppHybridKernels(), None
