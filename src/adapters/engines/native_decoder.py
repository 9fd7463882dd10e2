"""The native (torch) engine for decoder LMs: the decision family's forwards on our `DecoderLM`.

One set of kernels at every size (eager torch); rows are right-padded (padded accounting). The
shared-context branch layout (R-SC) runs through `prefix_kv` / `branch_logits`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vllm_srun.adapters.models.decoder import DecoderLM
from vllm_srun.domain.lanes import Accounting


class NativeDecoder:
    name = "native"
    accounting = Accounting.PADDED
    kernel_switch_tokens: int | None = None
    forward_threads = True  # torch kernels read the count each forward declares
    # padded eager forwards change a row's bits with its batch; a row alone is reproducible
    determinism = "rows_alone"

    def __init__(self, lm: DecoderLM) -> None:
        self.lm = lm

    @property
    def vocab_size(self) -> int:
        return int(self.lm.config.vocab_size)

    def describe(self) -> dict[str, Any]:
        return {"kernels": {"attention": "torch sdpa", "linear": "eager"}}

    def logits_at(self, input_ids: Any, positions: Any) -> Any:
        return self.lm.logits_at(input_ids, positions=positions)

    def prefix_kv(self, state_ids: Sequence[int]) -> Any:
        return self.lm.prefix_kv(list(state_ids))

    def branch_logits(self, state: Any, branches: Sequence[Sequence[int]], *, chunk: int) -> Any:
        return self.lm.branch_logits(state, [list(b) for b in branches], chunk=chunk)
