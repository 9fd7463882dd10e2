"""`domain/worker/load_retries` (R-LOAD-1): how often and when a model that failed to load transiently is
tried again; a final failure never is."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vllm_srun.domain.settings import bounds
from vllm_srun.domain.worker.load_retries import LoadRetryPolicy, attempt_reason, final_reason, waiting_reason

POLICIES = st.builds(
    LoadRetryPolicy,
    attempts=st.integers(bounds.LOAD_ATTEMPTS.low, bounds.LOAD_ATTEMPTS.high),
    first_delay_s=st.floats(bounds.LOAD_RETRY_SECONDS.low, bounds.LOAD_RETRY_SECONDS.high),
)


@given(POLICIES)
def test_the_waits_start_at_the_first_delay_double_and_stop_at_the_cap(policy: LoadRetryPolicy) -> None:
    waits = policy.schedule()
    assert len(waits) == policy.attempts - 1  # the first attempt is counted
    assert all(0 <= wait <= bounds.LOAD_RETRY_CAP_S for wait in waits)
    assert list(waits) == sorted(waits)
    for before, after in itertools.pairwise(waits):
        assert after == min(2 * before, bounds.LOAD_RETRY_CAP_S)
    if waits:
        assert waits[0] == policy.first_delay_s


@given(POLICIES, st.integers(1, 200), st.booleans())
def test_a_final_failure_or_the_last_attempt_ends_the_model(
    policy: LoadRetryPolicy, failed: int, transient: bool
) -> None:
    delay = policy.next_delay(failed, transient)
    if not transient or failed >= policy.attempts:
        assert delay is None
    else:
        assert delay == policy.delay_after(failed) == policy.schedule()[failed - 1]


def test_the_default_schedule_is_upstreams() -> None:
    assert LoadRetryPolicy().schedule() == (5.0, 10.0, 20.0, 40.0)  # 5 attempts, 5 s doubling
    assert LoadRetryPolicy(10, 5.0).schedule()[-4:] == (160.0, 300.0, 300.0, 300.0)  # capped at 300 s
    assert LoadRetryPolicy(1).schedule() == () and LoadRetryPolicy(1).next_delay(1, True) is None
    assert LoadRetryPolicy(3, 0.0).schedule() == (0.0, 0.0)


def test_nonsense_is_refused() -> None:
    with pytest.raises(ValueError, match="attempts"):
        LoadRetryPolicy(0)
    with pytest.raises(ValueError, match="delay"):
        LoadRetryPolicy(3, 301.0)
    with pytest.raises(ValueError, match="counted from 1"):
        LoadRetryPolicy().delay_after(0)


def test_what_health_says() -> None:
    why = "OSError: [Errno 5] Input/output error"
    assert waiting_reason(2, 5, 9.2, why) == f"loading (attempt 2 of 5, next in 10 s): {why}"
    assert waiting_reason(2, 5, 10.0, why) == f"loading (attempt 2 of 5, next in 10 s): {why}"
    assert waiting_reason(1, 5, 0.0, why).startswith("loading (attempt 1 of 5, next in 0 s)")
    assert attempt_reason(3, 5, why) == f"loading (attempt 3 of 5; the last one failed: {why})"
    assert final_reason(5, 5, why, transient=True) == f"{why} (after 5 attempts)"
    assert final_reason(1, 5, why, transient=False) == why
