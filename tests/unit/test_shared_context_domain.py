"""The shared-context decision (R-SC-2) is pure arithmetic: tokens saved against a break-even."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vllm_srun.domain.scheduling.shared_context import (
    MAX_BREAK_EVEN,
    BreakEven,
    break_even_tokens,
    shared_row_tokens,
    should_share,
    tokens_saved,
)


def test_tokens_saved_counts_every_question_but_one() -> None:
    assert tokens_saved(100, 1) == 0
    assert tokens_saved(100, 2) == 100
    assert tokens_saved(512, 128) == 127 * 512
    assert tokens_saved(0, 5) == 0 and tokens_saved(10, 0) == 0


def test_should_share_at_and_around_the_break_even() -> None:
    assert should_share(100, [5, 5], 100, True)  # saves exactly the break-even: share
    assert not should_share(100, [5, 5], 101, True)
    assert not should_share(100, [5, 5, 5], 0, False)  # turned off
    assert not should_share(100, [], 0, True)  # nothing to answer
    assert should_share(100, [5], 0, True)  # break-even 0: even one question shares (tests, benches)
    assert not should_share(100, [5], 1, True)  # one question saves nothing


@given(st.integers(1, 4096), st.integers(1, 300), st.integers(0, 100_000))
def test_more_questions_never_turn_sharing_off(state: int, n: int, threshold: int) -> None:
    if should_share(state, [8] * n, threshold, True):
        assert should_share(state, [8] * (n + 1), threshold, True)
        assert should_share(state + 1, [8] * n, threshold, True)


def test_shared_row_counts_the_state_once() -> None:
    assert shared_row_tokens(512, [20] * 128) == 512 + 20 * 128


def test_break_even_from_synthetic_timings() -> None:
    per_token = 1e-3
    # unshared: 4 rows × (64 + 8) tokens; shared: 64 + 4 × 8 tokens plus 10 ms of overhead → 10 tokens
    assert break_even_tokens(per_token * 288, 288, per_token * 96 + 0.010, 96) == 10
    assert break_even_tokens(per_token * 288, 288, per_token * 96, 96) == 0  # no overhead
    assert break_even_tokens(per_token * 288, 288, per_token * 50, 96) == 0  # faster than its tokens
    assert break_even_tokens(0.0, 288, 1.0, 96) == MAX_BREAK_EVEN
    assert break_even_tokens(math.inf, 288, 1.0, 96) == MAX_BREAK_EVEN
    with pytest.raises(ValueError):
        break_even_tokens(1.0, 0, 1.0, 1)


def test_break_even_record_refuses_negative_tokens() -> None:
    assert BreakEven(0, "manifest").tokens == 0
    with pytest.raises(ValueError):
        BreakEven(-1, "measured")


def test_shared_rows_keep_their_own_packed_lane_in_the_scheduler() -> None:
    """The decision family's lanes: unshared questions padded in `text`, shared requests packed in `shared`."""
    from vllm_srun.domain.scheduling.lanes import Accounting, Lane
    from vllm_srun.domain.scheduling.planning import Budget
    from vllm_srun.domain.scheduling.rows import RowSpec
    from vllm_srun.domain.scheduling.scheduler import Scheduler
    from vllm_srun.domain.scheduling.shared_context import SHARED_LANE

    lanes = [Lane("text", Accounting.PADDED), Lane(SHARED_LANE, Accounting.PACKED)]
    sched = Scheduler(lanes, Budget(max_num_seqs=8, max_num_batched_tokens=512), window_s=0.0)
    unshared = sched.submit([RowSpec(40 + i, None, "text") for i in range(3)], now=0.0)
    big = sched.submit([RowSpec(shared_row_tokens(300, [20] * 12), None, SHARED_LANE)], now=0.0)  # 540: runs alone
    small = sched.submit([RowSpec(shared_row_tokens(30, [5, 6]), None, SHARED_LANE)], now=0.0)
    answered: set[int] = set()
    seen = []
    while (batch := sched.next_forward(1.0)) is not None:
        assert len({r.lane for r in batch.rows}) == 1
        if batch.lane == SHARED_LANE:
            assert batch.tokens == sum(-(-r.tokens // 8) * 8 for r in batch.rows)
        assert batch.tokens <= 512 or len(batch.rows) == 1
        seen.append((batch.lane, len(batch.rows), batch.tokens))
        answered |= {a.request_id for a in sched.complete(batch, [None] * len(batch.rows))}
    assert answered == {unshared, big, small}
    assert ("text", 3, 3 * 48) in seen and (SHARED_LANE, 1, 544) in seen and (SHARED_LANE, 1, 48) in seen
