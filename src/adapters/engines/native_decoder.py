"""The native engines for decoder LMs: the decision family's forwards on our `DecoderLM`.

On a CPU in FP32 `native_decoder` builds the packed engine (`packed_decoder.py`: rows back to
back, every layer in one C++ call on oneDNN packed linears, batch-invariant); where it cannot
(`packed_decoder` says why in one line, which the card keeps as `kernels.reason`) and on a GPU,
`NativeDecoder`: rows right-padded (padded accounting), eager torch, a row's bits moving with its
batch. The shared-context branch layout (R-SC) runs through `prefix_kv` / `branch_logits` on the
eager LM in both. On a GPU at the published BF16 the fused Triton kernels (residual + RMSNorm,
SiLU·mul; `triton_decoder.py`) serve each call whose size (its tokens) is one where load-time
timings found them faster (R-DT-3).

`NativeHybridDecoder` serves the Qwen3.5 backbone (`models/qwen3_5.py`: Gated DeltaNet and gated
attention layers) through the same port: rows run back to back without padding (packed
accounting), each only up to the position asked; the shared-context branches continue the state's
recurrent state, conv tail and keys/values. On a CPU in FP32 the delta rule, the convolution and
every layer (unshared forwards, the state's and the branches') run on the C++ kernels
(engines/cpu_hybrid.py); elsewhere, or where they cannot be built, eager torch. Over a Qwen3.5 with its
vision tower (`models/qwen3_5_mm.py`) it also runs rows that read images and videos
(`media_logits`) and states with their media (`prefix_kv(state_ids, media)`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from vllm_srun.adapters.contracts import Determinism, Device, Progress
from vllm_srun.adapters.engines.packed_decoder import PackedDecoder, packed_decoder, right_padded
from vllm_srun.adapters.engines.triton_decoder import GpuDecoderKernels, decoder_kernels
from vllm_srun.adapters.models.answer_logits import pick
from vllm_srun.adapters.models.decoder import DecoderLM, DecoderOps
from vllm_srun.adapters.models.qwen3_5 import Qwen35LM
from vllm_srun.adapters.models.qwen3_5_mm import Qwen35VisionLM
from vllm_srun.domain.scheduling.lanes import Accounting


class NativeDecoder:
    name = "native"
    accounting = Accounting.PADDED
    forward_threads = True  # torch kernels read the count each forward declares
    # padded eager forwards change a row's bits with its batch; a row alone is reproducible
    determinism = Determinism.ROWS_ALONE

    def __init__(self, lm: DecoderLM, gpu: GpuDecoderKernels | None = None, reason: str = "reference kernels") -> None:
        self.lm = lm
        self.gpu = gpu
        self.reason = reason

    @property
    def kernel_switch_tokens(self) -> int | None:
        return self.gpu.switch_tokens if self.gpu is not None else None

    @property
    def vocab_size(self) -> int:
        return int(self.lm.config.vocab_size)

    def describe(self) -> dict[str, Any]:
        kernels: dict[str, Any] = {"attention": "torch sdpa", "linear": "eager", "reason": self.reason}
        if self.lm.device.type != "cpu":
            kernels["triton"] = self.gpu.card() if self.gpu is not None else None
        return {"kernels": kernels}

    def ops_for(self, tokens: int) -> DecoderOps | None:
        """The Triton kernels a forward of TOKENS tokens runs on (None: torch's own ops)."""
        return self.gpu.for_tokens(tokens) if self.gpu is not None else None

    def logits_at(self, rows: Sequence[Sequence[int]]) -> Any:
        """ROWS right-padded into one matrix (built on the host, moved once), logits after each
        row's last token."""
        ids, ends = right_padded(rows)
        device = self.lm.device
        return self.lm.logits_at(ids.to(device), positions=ends.to(device), ops=self.ops_for(int(ids.numel())))

    def answer_logits(self, rows: Sequence[Sequence[int]], tokens: Sequence[Sequence[int]]) -> Any:
        """The eager LM computes every row of its output layer; the answer tokens' are picked."""
        return pick(self.logits_at(rows), tokens)

    def prefix_kv(self, state_ids: Sequence[int]) -> Any:
        return self.lm.prefix_kv(list(state_ids), ops=self.ops_for(len(state_ids)))

    def branch_logits(self, state: Any, branches: Sequence[Sequence[int]], *, chunk: int) -> Any:
        rows = [list(b) for b in branches]
        width = max((len(b) for b in rows), default=0)
        return self.lm.branch_logits(state, rows, chunk=chunk, ops=self.ops_for(min(chunk, len(rows)) * width))


class NativeHybridDecoder:
    """The decoder port over a Qwen3.5 backbone (module doc)."""

    name = "native"
    accounting = Accounting.PACKED  # rows laid back to back: a forward computes only real tokens
    forward_threads = True
    kernel_switch_tokens = None  # the same torch ops at every size
    # eager torch: a row's last bits move with its neighbours (GEMM blocking by row count, the
    # vectorised tail of elementwise ops), so only a row run alone is reproducible
    determinism = Determinism.ROWS_ALONE

    def __init__(self, lm: Qwen35LM, reason: str | None = None) -> None:
        self.lm = lm
        self.reason = reason  # why the model's kernels are torch's where a CPU would run C++ ones

    @property
    def vocab_size(self) -> int:
        return int(self.lm.config.vocab_size)

    def describe(self) -> dict[str, Any]:
        layers = self.lm.config.layer_types
        kernels = {"attention": "torch sdpa per group of rows of one length", "linear": "eager"}
        kernels |= self.lm.kernels.card()
        if self.reason is not None:
            kernels["reason"] = self.reason
        return {
            "kernels": kernels,
            "backbone": {
                "architecture": "qwen3_5",
                "linear_attention_layers": sum(t == "linear_attention" for t in layers),
                "full_attention_layers": sum(t == "full_attention" for t in layers),
            },
        }

    @property
    def reads_media(self) -> bool:
        """Does the backbone carry a vision tower (rows with images and videos)?"""
        return self.lm.reads_media

    def logits_at(self, rows: Sequence[Sequence[int]]) -> Any:
        """ROWS handed over right-padded; the LM runs each packed, only up to its last token."""
        ids, ends = right_padded(rows)
        device = self.lm.device
        return self.lm.logits_at(ids.to(device), positions=ends.to(device))

    def answer_logits(self, rows: Sequence[Sequence[int]], tokens: Sequence[Sequence[int]]) -> Any:
        return pick(self.logits_at(rows), tokens)

    def prefix_kv(self, state_ids: Sequence[int], media: Sequence[Any] = ()) -> Any:
        if media:
            return self._vision_lm().prefix_kv(list(state_ids), media=media)
        return self.lm.prefix_kv(list(state_ids))

    def branch_logits(self, state: Any, branches: Sequence[Sequence[int]], *, chunk: int) -> Any:
        return self.lm.branch_logits(state, [list(b) for b in branches], chunk=chunk)

    def media_logits(self, rows: Sequence[Any]) -> Any:
        """Logits [R, V] after each row of `qwen3_5_mm.MediaRow`s (or (ids, media) pairs), packed."""
        return self._vision_lm().media_logits(rows)

    def _vision_lm(self) -> Qwen35VisionLM:
        """The LM as the one with a vision tower, or ValueError when it reads no media."""
        if not isinstance(self.lm, Qwen35VisionLM):
            raise ValueError("this model reads no images or videos")
        return self.lm


def native_decoder(
    lm: DecoderLM | Qwen35LM, device: Device, progress: Progress, env: Mapping[str, str] | None = None
) -> NativeDecoder | NativeHybridDecoder | PackedDecoder:
    """The native decoder engine for LM on DEVICE (with the fused kernels where they are faster)."""
    if isinstance(lm, Qwen35LM):
        if device.kind != "cpu":
            return NativeHybridDecoder(lm)
        from vllm_srun.adapters.engines.cpu_op_library import hybrid_kernels

        lm.kernels, why = hybrid_kernels(lm.dtype, progress, os.environ if env is None else env)
        return NativeHybridDecoder(lm, why)
    if device.kind == "cpu":
        found_cpu = packed_decoder(lm, progress, os.environ if env is None else env)
        if isinstance(found_cpu, str):
            progress(f"load: eager decoder kernels, each row padded ({found_cpu})")
            return NativeDecoder(lm, reason=found_cpu)
        return found_cpu
    found = decoder_kernels(lm, device, progress) if env is None else decoder_kernels(lm, device, progress, env)
    if isinstance(found, str):
        progress(f"load: eager decoder kernels on {device.name} ({found})")
        return NativeDecoder(lm, reason=found)
    progress(f"load: Triton decoder kernels on {device.name}: {found.card()}")
    return NativeDecoder(lm, found, "Triton where faster")
