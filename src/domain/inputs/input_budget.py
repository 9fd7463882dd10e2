"""A model's input budget (upstream's deployment `input: {max_tokens, overflow}`, R-PERF-5).

`max_tokens` caps one input below the model's own limit (None: the model's limit); `overflow`
is what is done with a longer input when the request sets no `options.overflow` (reject,
truncate or window; a surface without windows reads window as reject). The budget is the
deployment's: it applies to every request of every surface (classify, embeddings, rerank,
decisions), it is part of the result cache's key, and it is left out of the golden check's
replay of its recorded requests (`in_force(budget, replay=True)`; the call says whether it is
one, `adapters/call.py`): those were recorded without a budget.
"""

from __future__ import annotations

from dataclasses import dataclass

SOURCE = "the deployment's input.overflow"  # where a default overflow comes from, in messages


@dataclass(frozen=True, slots=True)
class InputBudget:
    max_tokens: int | None = None  # None: the model's own limit
    overflow: str = "reject"  # a request's overflow when it sets none

    def limit(self, model_limit: int) -> int:
        """The most tokens one input may have: the budget, never above MODEL_LIMIT."""
        return model_limit if self.max_tokens is None else min(self.max_tokens, model_limit)

    def capped(self, model_limit: int) -> bool:
        """Whether the budget is below MODEL_LIMIT (then refusals name it)."""
        return self.max_tokens is not None and self.max_tokens < model_limit

    def tag(self) -> str:
        """The budget as a part of a result cache key (the same answer only under the same budget)."""
        return f"input:{self.max_tokens if self.max_tokens is not None else '-'}:{self.overflow}"


NO_BUDGET = InputBudget()


def in_force(budget: InputBudget, replay: bool) -> InputBudget:
    """BUDGET, or no budget for the golden check's REPLAY of its recorded requests."""
    return NO_BUDGET if replay else budget
