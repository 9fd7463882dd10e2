"""The native (torch) engine object for encoders: `NativeEncoder` runs the unpadded forward
(`models/unpadded.py`) on the block linears a forward's size calls for, eager or the oneDNN packed
copies as its `KernelPlan` says, or on a GPU the Triton kernels `triton_encoder.py` chose.

`native.py` decides at load which of these an encoder gets (`native_encoder`); `cpu_int8.py`
subclasses it for int8 packages. Both import this module; it imports neither.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from vllm_srun.adapters.contracts import Determinism
from vllm_srun.adapters.contracts.batch import Ask, Batch, BatchOutputs
from vllm_srun.adapters.engines.cpu_onednn import PackedEncoder
from vllm_srun.adapters.engines.triton_encoder import GpuEncoderKernels
from vllm_srun.adapters.models.encoder_arch import eager_linears, hidden_states
from vllm_srun.adapters.models.pooling import finish
from vllm_srun.adapters.models.reference_encoder import ReferenceEncoder
from vllm_srun.adapters.models.unpadded import EAGER_OPS, ForwardOps, LayerLinears, PackedRows
from vllm_srun.adapters.models.unpadded import classify as unpadded_classify
from vllm_srun.adapters.models.unpadded import pooled as unpadded_pooled
from vllm_srun.domain.scheduling.lanes import Accounting
from vllm_srun.domain.worker.kernels import KernelPlan, bucket_rows

FORCED_UP_TO = 1 << 30  # VLLM_SRUN_ONEDNN=1: every forward on the packed copies


class NativeEncoder:
    """Our torch encoder; forwards the plan sends to the fast path run on the packed copies."""

    name = "native"
    forward_threads = True  # torch kernels read the count each forward declares

    def __init__(
        self,
        reference: ReferenceEncoder,
        packed: PackedEncoder | None = None,
        plan: KernelPlan | None = None,
        kernels: dict[str, Any] | None = None,
        gpu: GpuEncoderKernels | None = None,
        ops: ForwardOps = EAGER_OPS,
    ) -> None:
        plan = plan or KernelPlan()
        self.reference = reference
        self.gpu = gpu
        self.ops = ops
        self.packed = packed if plan.enabled else None
        self.plan = plan if packed is not None else KernelPlan()
        self.kernels = kernels or {"linear": "eager", "reason": "reference kernels"}
        self._eager_linears = eager_linears(reference.encoder)
        self._packed_linears = self.packed.layer_linears if self.packed is not None else []

    @property
    def kernel_switch_tokens(self) -> int | None:
        if self.gpu is not None:
            return self.gpu.switch_tokens
        return self.plan.fast_up_to if self.packed is not None else None

    @property
    def determinism(self) -> Determinism:
        """Packed for every forward: the packed linears give a row the same bits in any forward
        (R-BAT-5's probe confirms it at load), so rows may share forwards. Eager `F.linear`
        changes bits with the row count, so each row runs alone."""
        if self.packed is not None and self.plan.covers(FORCED_UP_TO):
            return Determinism.BATCH_INVARIANT
        return Determinism.ROWS_ALONE

    def describe(self) -> dict[str, Any]:
        return {"kernels": dict(self.kernels)}

    # rows run back to back without padding (models/unpadded.py): the planner counts packed tokens
    accounting = Accounting.PACKED

    @property
    def packed_linears(self) -> list[LayerLinears]:
        """The block linears of the oneDNN packed copies ([] without them)."""
        return self._packed_linears

    @property
    def one_call_linears(self) -> list[LayerLinears]:
        """The block linears a whole forward may run on in one call of the ops (`_whole`)."""
        return self._packed_linears

    def linears_for(self, tokens: int) -> list[LayerLinears]:
        """The block linears a CPU forward of TOKENS token rows runs on: the packed copies where
        the plan chose them, else eager."""
        if self.packed is not None and self.plan.use_fast(tokens):
            return self._packed_linears
        return self._eager_linears

    def kernels_for(self, tokens: int) -> tuple[list[LayerLinears], ForwardOps]:
        """The block linears and the attention and norm ops a forward of TOKENS token rows runs on
        (on a GPU: the Triton kernels chosen for that size)."""
        if self.gpu is not None:
            return self.gpu.for_tokens(tokens)
        return self.linears_for(tokens), self.ops

    def _kernels(self, batch: Sequence[Any]) -> tuple[int, list[LayerLinears], ForwardOps]:
        """BATCH's token count, and the linears and ops a forward of that size runs on (`kernels_for`)."""
        tokens = sum(len(row.ids) for row in batch)
        return (tokens, *self.kernels_for(tokens))

    def _hidden(
        self, batch: Sequence[Any], chosen: tuple[int, list[LayerLinears], ForwardOps]
    ) -> tuple[torch.Tensor, PackedRows]:
        _, linears, ops = chosen
        # packed linears run on bucketed row counts: the forward is padded once, not per linear
        pad_to = bucket_rows if self._packed_linears and linears is self._packed_linears else None
        rows = PackedRows.build(batch, self.reference.device, pad_to)
        # the hidden states from one call where the ops have it, the rows passed in ROWS' sorted
        # order so that they come back laid out as ROWS lays them (the same bits as the layer loop)
        whole = self._whole([batch[i] for i in rows.order], chosen, "none", False)
        if whole is not None:
            return whole[: rows.rows_total], rows
        return hidden_states(self.reference.encoder, rows, linears, ops), rows

    def _whole(
        self, batch: Sequence[Any], chosen: tuple[int, list[LayerLinears], ForwardOps], pooling: str, normalize: bool
    ) -> torch.Tensor | None:
        """The whole forward in one call of the ops (`ForwardOps.encode`: on a CPU, C++ that takes the
        GIL nowhere) where they have one for this encoder on these linears (`one_call_linears`); else None."""
        tokens, linears, ops = chosen
        if not linears or linears is not self.one_call_linears:
            return None
        return ops.encode(self.reference.encoder, linears, batch, bucket_rows(tokens), pooling, normalize)

    def forward(self, batch: Batch) -> BatchOutputs:
        """The encoder port (`contracts/batch.py`): each ask's rows through `embed`,
        `classify_logits` or the reference's `token_states`, answers in row order."""
        return batch.answer(
            {Ask.EMBEDDING: self.embed, Ask.LOGITS: self.classify_logits, Ask.TOKENS: self.reference.token_states}
        )

    def embed(self, batch: Sequence[Any]) -> np.ndarray:
        cfg = self.reference.pooling
        with torch.inference_mode():
            chosen = self._kernels(batch)
            if len(cfg.modes) == 1 and cfg.modes[0] in ("cls", "mean"):
                whole = self._whole(batch, chosen, cfg.modes[0], cfg.normalize and not cfg.steps)
                if whole is not None:
                    return self.reference.numpy(finish(whole, cfg) if cfg.steps else whole)
            hidden, rows = self._hidden(batch, chosen)
            return self.reference.numpy(unpadded_pooled(hidden, rows, cfg))

    def classify_logits(self, batch: Sequence[Any]) -> np.ndarray:
        reference = self.reference
        if reference.head is None:
            raise ValueError("this model has no sequence-classification head")
        with torch.inference_mode():
            chosen = self._kernels(batch)
            packed = self.packed
            if packed is not None and packed.classifier is not None:
                first = self._whole(batch, chosen, "cls", False)  # each row's first token, in the caller's order
                if first is not None:
                    return reference.numpy(packed.logits(first[:, None, :]))
            hidden, rows = self._hidden(batch, chosen)
            if packed is not None and not self.plan.use_fast(rows.tokens):
                packed = None  # eager serves a forward of this size
            if packed is not None and packed.classifier is not None:
                return reference.numpy(unpadded_classify(hidden, rows, packed.logits))
            head = reference.head
            return reference.numpy(unpadded_classify(hidden, rows, head, first_token=head.reads_first_token))
