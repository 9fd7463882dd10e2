"""R-ADM-1 admission against a simple model: refusals happen exactly when a limit would be passed
while something is pending, the counts always equal what the held tickets hold (the bound they
were admitted with, then the tokens of the rows they made, never more than the bound),
Retry-After is within [1, 60] and follows the measured drain rate."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tests.fakes import FakeClock
from vllm_srun.domain.errors import Overloaded
from vllm_srun.domain.scheduling.admission import (
    MAX_RETRY_AFTER_S,
    MIN_RETRY_AFTER_S,
    Admission,
    AdmissionLimits,
    RetryDiscipline,
    Ticket,
)


class AdmissionMachine(RuleBasedStateMachine):
    @initialize(queue=st.integers(1, 6), tokens=st.integers(1, 400))
    def start(self, queue: int, tokens: int) -> None:
        self.clock = FakeClock()
        self.limits = AdmissionLimits(queue, tokens)
        self.admission = Admission(self.limits, horizon_s=5.0)
        self.held: list[Ticket] = []
        self.made: dict[int, int] = {}  # tokens of the rows each held ticket made so far

    @rule(requests=st.integers(1, 4), tokens=st.integers(0, 600))
    def admit(self, requests: int, tokens: int) -> None:
        pending = sum(t.requests for t in self.held)
        pending_tokens = sum(t.tokens for t in self.held)
        fits = pending == 0 or (
            pending + requests <= self.limits.max_queue and pending_tokens + tokens <= self.limits.max_queued_tokens
        )
        try:
            ticket = self.admission.admit(requests, tokens, self.clock.now())
        except Overloaded as refusal:
            assert not fits
            assert MIN_RETRY_AFTER_S <= refusal.retry_after_s <= MAX_RETRY_AFTER_S
            return
        assert fits
        assert ticket.requests == requests and ticket.tokens == tokens
        self.held.append(ticket)
        self.made[id(ticket)] = 0

    @precondition(lambda self: self.held)
    @rule(which=st.integers(0, 100), tokens=st.integers(0, 300))
    def rows_made(self, which: int, tokens: int) -> None:
        ticket = self.held[which % len(self.held)]
        self.made[id(ticket)] += tokens
        self.admission.count_rows(ticket, tokens)
        assert ticket.tokens == min(ticket.bound, self.made[id(ticket)])

    @precondition(lambda self: self.held)
    @rule(which=st.integers(0, 100), answered=st.booleans())
    def release(self, which: int, answered: bool) -> None:
        ticket = self.held.pop(which % len(self.held))
        self.admission.release(ticket, self.clock.now(), answered=answered)
        with pytest.raises(ValueError):
            self.admission.release(ticket, self.clock.now(), answered=answered)
        pending = self.admission.pending_tokens
        self.admission.count_rows(ticket, 5)  # a released ticket holds nothing
        assert self.admission.pending_tokens == pending

    @rule(seconds=st.floats(0, 3))
    def wait(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @invariant()
    def counts_are_what_the_tickets_hold(self) -> None:
        assert self.admission.pending_requests == sum(t.requests for t in self.held)
        assert self.admission.pending_tokens == sum(t.tokens for t in self.held)
        assert all(0 <= t.tokens <= t.bound for t in self.held)

    @invariant()
    def the_rate_is_measured_or_absent(self) -> None:
        rate = self.admission.drain_rate(self.clock.now())
        if rate is not None:
            assert rate.requests_per_s > 0 and rate.tokens_per_s >= 0


TestAdmission = AdmissionMachine.TestCase
TestAdmission.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_one_request_larger_than_the_token_limit_gets_in_alone() -> None:
    clock = FakeClock()
    admission = Admission(AdmissionLimits(max_queue=4, max_queued_tokens=100))
    huge = admission.admit(1, 10_000, clock.now())
    with pytest.raises(Overloaded, match="--max-queued-tokens 100"):
        admission.admit(1, 1, clock.now())
    admission.release(huge, clock.now(), answered=True)
    admission.admit(1, 100, clock.now())


def test_requests_hold_their_rows_tokens_once_made_not_their_bodies_bound() -> None:
    """64 bodies of 1,030 bytes (the bound) whose rows hold 230 tokens each all get in under the
    default 65,536 once each has made its rows; held at their bounds, the 64th is refused."""
    clock = FakeClock()
    at_bounds = Admission(AdmissionLimits(max_queue=128, max_queued_tokens=65_536))
    for _ in range(63):
        at_bounds.admit(1, 1_030, clock.now())
    with pytest.raises(Overloaded, match="--max-queued-tokens 65536"):
        at_bounds.admit(1, 1_030, clock.now())
    admission = Admission(AdmissionLimits(max_queue=128, max_queued_tokens=65_536))
    held = []
    for _ in range(64):
        ticket = admission.admit(1, 1_030, clock.now())
        admission.count_rows(ticket, 230)
        held.append(ticket)
    assert admission.pending_tokens == 64 * 230
    admission.count_rows(held[0], 2_000)  # more rows than the bound covers: held at the bound
    assert held[0].tokens == 1_030 and admission.pending_tokens == 63 * 230 + 1_030
    with pytest.raises(ValueError):
        admission.count_rows(held[1], -1)
    for ticket in held:
        admission.release(ticket, clock.now(), answered=True)
    assert admission.pending_tokens == 0 and admission.held("default") == (0, 0)


def test_a_bundle_is_admitted_together_or_not_at_all() -> None:
    clock = FakeClock()
    admission = Admission(AdmissionLimits(max_queue=4, max_queued_tokens=10_000))
    first = admission.admit(2, 10, clock.now())
    with pytest.raises(Overloaded, match="--max-queue 4"):
        admission.admit(3, 10, clock.now())  # 2 + 3 > 4: none of the three is held
    assert admission.pending_requests == 2
    admission.admit(2, 10, clock.now())
    admission.release(first, clock.now(), answered=True)
    assert admission.pending_requests == 2


def saturate(admission: Admission, clock: FakeClock, per_second: int, tokens: int, seconds: int) -> Ticket:
    """Answer PER_SECOND requests of TOKENS tokens each second, the queue never empty; the
    ticket still held at the end."""
    held = [admission.admit(1, tokens, clock.now())]
    for _ in range(seconds * per_second):
        held.append(admission.admit(1, tokens, clock.now()))
        clock.advance(1 / per_second)
        admission.release(held.pop(0), clock.now(), answered=True)
    return held[0]


@given(per_second=st.integers(2, 400), queue=st.integers(2, 64))
def test_retry_after_is_the_time_the_measured_rate_needs_for_the_queue(per_second: int, queue: int) -> None:
    clock = FakeClock()
    admission = Admission(AdmissionLimits(max_queue=queue, max_queued_tokens=10**9))
    saturate(admission, clock, per_second, 10, seconds=3)
    rate = admission.drain_rate(clock.now())
    assert rate is not None and rate.requests_per_s == pytest.approx(per_second, rel=0.05)
    while admission.pending_requests < queue:
        admission.admit(1, 10, clock.now())
    with pytest.raises(Overloaded) as refused:
        admission.admit(1, 10, clock.now())
    expected = min(MAX_RETRY_AFTER_S, max(MIN_RETRY_AFTER_S, math.ceil(queue / rate.requests_per_s)))
    assert refused.value.retry_after_s == expected


def test_retry_after_by_tokens_follows_the_token_rate() -> None:
    clock = FakeClock()
    admission = Admission(AdmissionLimits(max_queue=10_000, max_queued_tokens=10_000))
    saturate(admission, clock, per_second=10, tokens=100, seconds=3)  # 1,000 tokens/s
    while admission.pending_tokens + 1_000 <= 10_000:
        admission.admit(1, 1_000, clock.now())
    with pytest.raises(Overloaded) as refused:
        admission.admit(1, 1_000, clock.now())
    assert refused.value.retry_after_s == math.ceil(admission.pending_tokens / 1_000)


def test_idle_time_does_not_dilute_the_rate_and_old_work_is_forgotten() -> None:
    clock = FakeClock()
    admission = Admission(AdmissionLimits(max_queue=8, max_queued_tokens=10**6), horizon_s=10.0)
    assert admission.drain_rate(clock.now()) is None  # nothing measured: Retry-After 1
    last = saturate(admission, clock, per_second=50, tokens=1, seconds=1)
    admission.release(last, clock.now(), answered=False)
    clock.advance(3.0)  # idle: nothing pending
    rate = admission.drain_rate(clock.now())
    assert rate is not None and rate.requests_per_s == pytest.approx(50, rel=0.05)
    clock.advance(20.0)
    assert admission.drain_rate(clock.now()) is None
    refused_with = []
    for _ in range(9):
        try:
            admission.admit(1, 1, clock.now())
        except Overloaded as exc:
            refused_with.append(exc.retry_after_s)
    assert refused_with == [MIN_RETRY_AFTER_S]


def test_a_stalled_model_says_the_longest_wait() -> None:
    clock = FakeClock()
    admission = Admission(AdmissionLimits(max_queue=2, max_queued_tokens=10**6))
    saturate(admission, clock, per_second=1, tokens=1, seconds=2)
    admission.admit(1, 1, clock.now())
    clock.advance(4.0)  # busy, nothing answered for a while: the rate drops
    with pytest.raises(Overloaded) as refused:
        admission.admit(1, 1, clock.now())
    assert refused.value.retry_after_s >= 2


def test_limits_are_positive() -> None:
    with pytest.raises(ValueError):
        AdmissionLimits(0, 1)
    with pytest.raises(ValueError):
        Admission(AdmissionLimits(1, 1)).admit(0, 1, 0.0)


def test_a_client_that_ignores_retry_after_waits_it_out() -> None:
    clock = FakeClock()
    discipline = RetryDiscipline()
    assert discipline.wait_s("conn-1", clock.now()) == 0.0  # never refused: tried at once
    discipline.refused("conn-1", clock.now(), 2)
    clock.advance(0.5)
    assert discipline.wait_s("conn-2", clock.now()) == 0.0  # another connection is not held
    assert discipline.wait_s("conn-1", clock.now()) == pytest.approx(1.5)  # asked again too soon
    assert discipline.wait_s("conn-1", clock.now()) == 0.0  # held once, then tried like any other
    discipline.refused("conn-1", clock.now(), 1)
    clock.advance(3.0)  # it honoured Retry-After
    assert discipline.wait_s("conn-1", clock.now()) == 0.0


@given(keys=st.lists(st.integers(0, 50), max_size=300), cap=st.integers(1, 20))
def test_the_discipline_remembers_a_bounded_number_of_clients(keys: list[int], cap: int) -> None:
    clock = FakeClock()
    discipline = RetryDiscipline(max_keys=cap)
    for key in keys:
        discipline.refused(key, clock.now(), 1)
        clock.advance(0.01)
        assert len(discipline) <= cap
