"""Replicas found through DNS (`domain/fleet/discovery.py`): one resolution adds exactly the new
addresses and drains exactly the vanished ones; a failed or empty one changes nothing; a failing
name is announced once per streak; a drain ends when nothing is held or the limit passed."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from vllm_srun.domain.fleet.discovery import Announcement, ResolutionStreak, drain_finished, plan_discovery

ADDRESSES = st.sampled_from(["10.0.0.1", "10.0.0.2", "10.0.0.3", "fd00::1", "fd00::2"])
SETS = st.sets(ADDRESSES, max_size=5)


@given(SETS, SETS)
def test_a_resolution_adds_the_new_and_drains_the_vanished(serving: set[str], resolved: set[str]) -> None:
    change = plan_discovery(serving, resolved)
    if not resolved:  # an empty answer is a failure: the last good set stays
        assert change.failed and change.added == change.drained == () and set(change.kept) == serving
        return
    assert not change.failed
    assert set(change.added) | set(change.kept) == resolved  # afterwards the served set is the answer
    assert not set(change.added) & serving and set(change.drained) <= serving
    assert not set(change.drained) & resolved
    assert set(change.kept) | set(change.drained) == serving  # every served address is kept or drained, once
    assert list(change.added) == sorted(change.added) and list(change.drained) == sorted(change.drained)


@given(SETS)
def test_a_failed_resolution_keeps_the_last_good_set(serving: set[str]) -> None:
    change = plan_discovery(serving, None)
    assert change.failed and change.added == () and change.drained == () and set(change.kept) == serving


@given(st.lists(st.booleans(), max_size=30))
def test_a_failing_name_is_announced_once_per_streak(outcomes: list[bool]) -> None:
    streak, said = ResolutionStreak(), []
    for succeeded in outcomes:
        streak, announcement = streak.after(succeeded)
        said.append(announcement)
    # the model: an announcement exactly where the outcome flips (failure first after success or start)
    expected, failing = [], False
    for succeeded in outcomes:
        if not succeeded and not failing:
            expected.append(Announcement.FAILING)
        elif succeeded and failing:
            expected.append(Announcement.RECOVERED)
        else:
            expected.append(None)
        failing = not succeeded
    assert said == expected
    trailing = len(outcomes) - len("".join("x" if o else "." for o in outcomes).rstrip("."))
    assert streak.failures_in_a_row == trailing


@given(st.integers(0, 5), st.floats(0, 100), st.floats(0.1, 100))
def test_a_drain_ends_when_nothing_is_held_or_the_limit_passed(in_flight: int, waited: float, limit: float) -> None:
    assert drain_finished(in_flight, waited, limit) == (in_flight == 0 or waited >= limit)
