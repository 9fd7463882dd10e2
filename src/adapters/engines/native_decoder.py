"""The native (torch) engine for decoder LMs: the decision family's forwards on our `DecoderLM`.

Rows are right-padded (padded accounting). The shared-context branch layout (R-SC) runs through
`prefix_kv` / `branch_logits`. Eager torch on a CPU; on a GPU at the published BF16 the fused
Triton kernels (residual + RMSNorm, SiLU·mul; `triton_decoder.py`) serve each call whose size (its
tokens) is one where load-time timings found them faster (R-DT-3).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from vllm_srun.adapters.contracts import Determinism, Device, Progress
from vllm_srun.adapters.engines.triton_decoder import GpuDecoderKernels, decoder_kernels
from vllm_srun.adapters.models.decoder import DecoderLM, DecoderOps
from vllm_srun.domain.lanes import Accounting


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
        kernels: dict[str, Any] = {"attention": "torch sdpa", "linear": "eager"}
        if self.lm.device.type != "cpu":
            kernels["triton"] = self.gpu.card() if self.gpu is not None else None
            kernels["reason"] = self.reason
        return {"kernels": kernels}

    def ops_for(self, tokens: int) -> DecoderOps | None:
        """The Triton kernels a forward of TOKENS tokens runs on (None: torch's own ops)."""
        return self.gpu.for_tokens(tokens) if self.gpu is not None else None

    def logits_at(self, input_ids: Any, positions: Any) -> Any:
        return self.lm.logits_at(input_ids, positions=positions, ops=self.ops_for(int(input_ids.numel())))

    def prefix_kv(self, state_ids: Sequence[int]) -> Any:
        return self.lm.prefix_kv(list(state_ids), ops=self.ops_for(len(state_ids)))

    def branch_logits(self, state: Any, branches: Sequence[Sequence[int]], *, chunk: int) -> Any:
        rows = [list(b) for b in branches]
        width = max((len(b) for b in rows), default=0)
        return self.lm.branch_logits(state, rows, chunk=chunk, ops=self.ops_for(min(chunk, len(rows)) * width))


def native_decoder(
    lm: DecoderLM, device: Device, progress: Progress, env: Mapping[str, str] | None = None
) -> NativeDecoder:
    """The native decoder engine for LM on DEVICE (with the fused kernels where they are faster)."""
    if device.kind == "cpu":
        return NativeDecoder(lm)
    found = decoder_kernels(lm, device, progress) if env is None else decoder_kernels(lm, device, progress, env)
    if isinstance(found, str):
        progress(f"load: eager decoder kernels on {device.name} ({found})")
        return NativeDecoder(lm, reason=found)
    progress(f"load: Triton decoder kernels on {device.name}: {found.card()}")
    return NativeDecoder(lm, found, "Triton where faster")
