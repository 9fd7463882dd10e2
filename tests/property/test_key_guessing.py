"""Slowing key guessing (`domain/security/key_guessing.py`, R-AUTH-2) against a simple model, under a
fake clock: a client is refused exactly when it sent its limit of wrong keys within the window
(per connection, per address), for exactly as long as the oldest of them still counts; clients
that sent none are never refused; memory stays bounded."""

from __future__ import annotations

import math

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from vllm_srun.domain.security.key_guessing import FailureWindow, GuessLimits, WrongKeyLimiter

CONNECTIONS = st.integers(0, 5)
ADDRESSES = st.sampled_from(["10.0.0.1", "10.0.0.2", "10.0.0.3"])


class GuessMachine(RuleBasedStateMachine):
    @initialize(per_connection=st.integers(1, 4), per_address=st.integers(1, 8), window=st.sampled_from([1.0, 5.0]))
    def start(self, per_connection: int, per_address: int, window: float) -> None:
        self.limits = GuessLimits(per_connection=per_connection, per_address=per_address, window_s=window)
        self.limiter = WrongKeyLimiter(self.limits)
        self.now = 0.0
        self.failures: list[tuple[int, str, float]] = []  # the model: every counted wrong key

    def expected_wait(self, connection: int, address: str) -> float:
        live = [f for f in self.failures if f[2] + self.limits.window_s > self.now]
        waits = [0.0]
        for key, limit, index in ((connection, self.limits.per_connection, 0), (address, self.limits.per_address, 1)):
            mine = sorted(f[2] for f in live if f[index] == key)
            if len(mine) >= limit:
                waits.append(mine[-limit] + self.limits.window_s - self.now)
        return max(waits)

    @rule(connection=CONNECTIONS, address=ADDRESSES)
    def wrong_key(self, connection: int, address: str) -> None:
        wait = self.expected_wait(connection, address)
        got = self.limiter.retry_after_s(connection, address, self.now)
        if wait > 0:
            assert got == max(1, math.ceil(wait))
            return  # refused unread: not counted
        assert got is None
        self.limiter.failed(connection, address, self.now)
        self.failures.append((connection, address, self.now))

    @rule(connection=CONNECTIONS, address=ADDRESSES)
    def look(self, connection: int, address: str) -> None:
        wait = self.expected_wait(connection, address)
        got = self.limiter.retry_after_s(connection, address, self.now)
        assert got == (max(1, math.ceil(wait)) if wait > 0 else None)

    @rule(seconds=st.sampled_from([0.1, 0.5, 1.0, 2.5]))
    def advance(self, seconds: float) -> None:
        self.now += seconds

    @invariant()
    def innocent_clients_go_on(self) -> None:
        if hasattr(self, "limiter"):
            assert self.limiter.retry_after_s("never-failed", "192.0.2.9", self.now) is None


GuessMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)
TestGuessing = GuessMachine.TestCase


def test_a_guesser_is_slowed_and_a_client_elsewhere_is_not() -> None:
    limiter = WrongKeyLimiter(GuessLimits(per_connection=3, per_address=5, window_s=60))
    for i in range(3):
        assert limiter.retry_after_s("c1", "a1", float(i)) is None
        limiter.failed("c1", "a1", float(i))
    assert limiter.retry_after_s("c1", "a1", 3.0) == 57  # the first failure counts until t=60
    assert limiter.retry_after_s("c2", "a1", 3.0) is None  # another connection of the address: 3 of 5 so far
    assert limiter.retry_after_s("c3", "a2", 3.0) is None  # another client
    assert limiter.retry_after_s("c1", "a1", 60.0) is None  # one more guess once the first left the window


@pytest.mark.parametrize("tracked", [1, 3, 50])
def test_memory_is_bounded_and_recent_guessers_are_kept(tracked: int) -> None:
    window = FailureWindow(limit=2, window_s=10.0, max_tracked=tracked)
    for i in range(10_000):
        window.failed(("addr", i), now=i * 0.001)
        assert len(window) <= tracked
    last = ("addr", 9_999)
    window.failed(last, now=10.0)
    assert window.wait_s(last, 10.0) > 0  # the most recent guesser is remembered


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError):
        GuessLimits(per_connection=0)
    with pytest.raises(ValueError):
        GuessLimits(window_s=math.inf)
