"""Shared context (R-SC): when a decision request runs its state once and branches its questions.

Pure arithmetic over token counts and timings; the adapters measure, this module decides.

Cost model. Unshared, every question is its own row `state + question`: about c·n·(S+Q̄)
seconds at c seconds per token. Shared, the state runs once and each question attends to its
keys and values: about c·(S + n·Q̄) + o, where o is the shared path's extra fixed cost (two
passes instead of one, the state's K/V kept, the merge). Sharing wins when the tokens it saves,
(n-1)·S, cost more than o: the *break-even* is o / c tokens, measured per backbone and device
at load (`break_even_tokens`) and reported in the card.

Scheduling. A shared request is one row of the `shared` lane whose token count is the state
plus every question (the tokens its forward really computes); that lane is packed (its forwards
count the sum of their rows, each rounded up to 8) and never mixes with the padded `text` lane
of unshared question rows, so the planner's budgets stay honest for both.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

SHARED_LANE = "shared"
MAX_BREAK_EVEN = 1 << 24  # "never share" in practice, still an int for the card


@dataclass(frozen=True, slots=True)
class BreakEven:
    """Tokens a request must save before sharing pays, and where that number came from."""

    tokens: int
    source: str  # measured | manifest | option (a models file's) | deterministic

    def __post_init__(self) -> None:
        if self.tokens < 0:
            raise ValueError(f"break-even tokens must be >= 0 (got {self.tokens})")


def tokens_saved(state_tokens: int, questions: int) -> int:
    """State tokens a shared run does not recompute: every question but one re-reads the state."""
    return max(questions - 1, 0) * max(state_tokens, 0)


def should_share(state_tokens: int, question_tokens: Sequence[int], break_even_tokens: int, enabled: bool) -> bool:
    """Share when enabled, there is at least one question, and the tokens saved reach the break-even."""
    if not enabled or not question_tokens or state_tokens < 1:
        return False
    return tokens_saved(state_tokens, len(question_tokens)) >= break_even_tokens


def shared_row_tokens(state_tokens: int, question_tokens: Sequence[int]) -> int:
    """What a shared request's row counts against the budgets: the state once, then every question."""
    return state_tokens + sum(question_tokens)


def break_even_tokens(unshared_s: float, unshared_tokens: int, shared_s: float, shared_tokens: int) -> int:
    """The break-even from one timed comparison on the same state and questions.

    `unshared_s` ran `unshared_tokens` tokens (n rows of state + question); `shared_s` ran
    `shared_tokens` (the state once plus the questions). The cost per token comes from the
    unshared run; whatever the shared run took beyond its tokens at that cost is its fixed
    overhead, expressed in tokens.
    """
    if unshared_tokens < 1 or shared_tokens < 1:
        raise ValueError("both timed runs need at least one token")
    if not (math.isfinite(unshared_s) and math.isfinite(shared_s)) or unshared_s <= 0:
        return MAX_BREAK_EVEN
    per_token = unshared_s / unshared_tokens
    overhead = shared_s - per_token * shared_tokens
    if overhead <= 0:
        return 0
    return min(math.ceil(overhead / per_token - 1e-9), MAX_BREAK_EVEN)  # float noise never adds a token
