"""R-REP-5 outlier ejection against an independent model, under a fake clock.

The machine feeds outcomes to `EjectionPolicy.observe` for replicas it picks itself (so any
replica can be made to time out), moves the clock and flips readiness. The model re-derives
every decision from the SPEC's words and the events must match it exactly; invariants check
the limits: never past max_ejection_percent (one always allowed), never the only replica,
never one that no other ready replica out-answered, doubling up to the cap, one success
readmits and resets.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from tests.fakes import FakeClock
from vllm_srun.domain.fleet.ejection import (
    EjectionPolicy,
    EjectionWithheld,
    OutlierDetection,
    ProbeHealth,
    ReplicaBackedOff,
    ReplicaEjected,
    ReplicaReadmitted,
)
from vllm_srun.domain.fleet.replicas import Outcome, Replica


@dataclass
class Model:
    """What the SPEC says one replica's outlier state should be."""

    up: bool = True
    count: int = 0
    run_started: float | None = None
    answered_at: float | None = None
    backoff: float = 0.0
    backoff_until: float = float("-inf")
    ejected_until: float | None = None
    in_a_row: int = 0


# timeouts drive ejection, so they come up more often than the other outcomes
OUTCOMES = [Outcome.TIMEOUT, Outcome.TIMEOUT, Outcome.OK, Outcome.OK] + [
    Outcome.FAILED,
    Outcome.CANCELLED,
    Outcome.REJECTED,
]


class EjectionMachine(RuleBasedStateMachine):
    @initialize(
        count=st.sampled_from([1, 2, 2, 3, 4, 6]),
        threshold=st.sampled_from([0, 1, 1, 2, 3]),
        base_ms=st.sampled_from([100, 250, 1000]),
        factor=st.sampled_from([None, 1, 3, 8]),
        percent=st.sampled_from([0, 10, 34, 50, 100]),
    )
    def start(self, count: int, threshold: int, base_ms: int, factor: int | None, percent: int) -> None:
        self.clock = FakeClock()
        self.settings = OutlierDetection(
            consecutive_timeouts=threshold,
            base_ejection_ms=base_ms,
            max_ejection_ms=None if factor is None else base_ms * factor,
            max_ejection_percent=percent,
        )
        self.cap_s = (base_ms * (factor or 10)) / 1000
        self.policy = EjectionPolicy(self.settings)
        self.replicas = [Replica(f"r{i}", ready=True) for i in range(count)]
        self.model = [Model() for _ in range(count)]
        self.allowed = 0 if count == 1 else max(1, count * percent // 100)

    # ---- helpers --------------------------------------------------------------------------
    def _ejected(self, index: int, now: float) -> bool:
        until = self.model[index].ejected_until
        return until is not None and now < until

    def _expected_expiry(self, now: float) -> list[object]:
        events: list[object] = []
        for index, model in enumerate(self.model):
            if model.ejected_until is not None and now >= model.ejected_until:
                model.ejected_until = None
                events.append(ReplicaReadmitted(f"r{index}", "cooldown"))
        return events

    def _back_off(self, index: int, now: float) -> ReplicaBackedOff:
        model = self.model[index]
        model.backoff = 0.1 if model.backoff == 0 else min(model.backoff * 2, 3.2)
        model.backoff_until = max(model.backoff_until, now + model.backoff)
        return ReplicaBackedOff(f"r{index}", model.backoff, model.backoff_until)

    def _decide(self, index: int, now: float) -> object:
        model = self.model[index]
        if len(self.model) == 1:
            return EjectionWithheld(f"r{index}", "single_replica")
        answered = [
            other
            for j, other in enumerate(self.model)
            if j != index
            and other.up
            and not self._ejected(j, now)
            and other.answered_at is not None
            and model.run_started is not None
            and other.answered_at > model.run_started
        ]
        if not answered:
            return EjectionWithheld(f"r{index}", "no_other_replica_answered")
        ejected = sum(self._ejected(j, now) for j in range(len(self.model)) if j != index)
        if ejected >= self.allowed:
            return EjectionWithheld(f"r{index}", "max_ejection_percent")
        seconds = min(self.settings.base_ejection_ms * 2**model.in_a_row / 1000, self.cap_s)
        model.in_a_row += 1
        model.ejected_until = now + seconds
        return ReplicaEjected(f"r{index}", seconds, now + seconds, model.in_a_row)

    # ---- rules ------------------------------------------------------------------------------
    @rule(
        index=st.integers(0, 5),
        outcome=st.sampled_from(OUTCOMES),
        age=st.sampled_from([0.0, 0.5, 2.0, 10.0]),
    )
    def finish(self, index: int, outcome: Outcome, age: float) -> None:
        index %= len(self.replicas)
        now = self.clock.now()
        sent = now - age
        replica, model = self.replicas[index], self.model[index]
        count_before = model.count
        expected = self._expected_expiry(now)
        if outcome is Outcome.OK:
            if self._ejected(index, now):
                expected.append(ReplicaReadmitted(f"r{index}", "success"))
            model.count, model.run_started, model.answered_at = 0, None, now
            model.backoff, model.backoff_until = 0.0, float("-inf")
            model.ejected_until, model.in_a_row = None, 0
        elif outcome is Outcome.FAILED:
            expected += [self._back_off(index, now), ProbeHealth(f"r{index}")]
        elif outcome is Outcome.TIMEOUT:
            model.count += 1
            if model.run_started is None or sent < model.run_started:
                model.run_started = sent
            expected.append(self._back_off(index, now))
            threshold = self.settings.consecutive_timeouts
            if threshold and model.count >= threshold and not self._ejected(index, now):
                expected.append(self._decide(index, now))
            expected.append(ProbeHealth(f"r{index}"))
        events = self.policy.observe(replica, outcome, now, self.replicas, started_at=sent)
        assert events == expected
        if outcome in (Outcome.CANCELLED, Outcome.REJECTED, Outcome.FAILED):
            assert replica.consecutive_timeouts == count_before  # neither counts nor resets
        for event in events:
            if isinstance(event, ReplicaEjected):
                assert event.seconds <= self.cap_s
                assert event.seconds == pytest.approx(
                    min(
                        self.settings.base_ejection_ms / 1000 * 2 ** (event.ejections_in_a_row - 1),
                        self.cap_s,
                    )
                )

    @rule(index=st.integers(0, 5))
    def stuck(self, index: int) -> None:
        """A run of timeouts long enough to reach the threshold, each sent 10 s earlier."""
        for _ in range(max(1, self.settings.consecutive_timeouts)):
            self.finish(index, Outcome.TIMEOUT, 10.0)
            self.clock.advance(0.01)

    @rule(seconds=st.sampled_from([0.05, 0.1, 0.3, 1.0, 5.0, 30.0]))
    def wait(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule()
    def tick(self) -> None:
        now = self.clock.now()
        expected = self._expected_expiry(now)
        assert self.policy.expire(self.replicas, now) == expected

    @rule(index=st.integers(0, 5), up=st.booleans())
    def readiness(self, index: int, up: bool) -> None:
        index %= len(self.replicas)
        replica = self.replicas[index]
        replica.mark_ready() if up else replica.mark_failed("health probe failed")
        self.model[index].up = up

    # ---- invariants ---------------------------------------------------------------------
    @invariant()
    def agrees_with_the_model(self) -> None:
        if not hasattr(self, "replicas"):
            return
        now = self.clock.now()
        for replica, model in zip(self.replicas, self.model, strict=True):
            assert replica.consecutive_timeouts == model.count
            assert replica.is_ejected(now) == (model.ejected_until is not None and now < model.ejected_until)
            assert replica.in_backoff(now) == (now < model.backoff_until)
            assert replica.ejection_count == model.in_a_row

    @invariant()
    def never_past_the_ejection_limits(self) -> None:
        if not hasattr(self, "replicas"):
            return
        now = self.clock.now()
        ejected = sum(replica.is_ejected(now) for replica in self.replicas)
        assert ejected <= self.allowed
        if len(self.replicas) == 1 or not self.settings.enabled:
            assert ejected == 0


EjectionMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestEjection = EjectionMachine.TestCase


# ---- worked examples --------------------------------------------------------------------
def _pool(count: int, **settings: int) -> tuple[EjectionPolicy, list[Replica]]:
    return EjectionPolicy(OutlierDetection(**settings)), [Replica(f"r{i}", ready=True) for i in range(count)]


def _kinds(events: list[object]) -> list[str]:
    return [type(event).__name__ for event in events]


def test_a_stuck_replica_is_ejected_after_three_timeouts_while_another_answers() -> None:
    policy, (a, b) = _pool(2)
    assert policy.observe(b, Outcome.TIMEOUT, 10.0, [a, b], started_at=5.0)
    policy.observe(a, Outcome.OK, 10.5, [a, b])
    policy.observe(b, Outcome.TIMEOUT, 11.0, [a, b], started_at=6.0)
    events = policy.observe(b, Outcome.TIMEOUT, 12.0, [a, b], started_at=7.0)
    assert _kinds(events) == ["ReplicaBackedOff", "ReplicaEjected", "ProbeHealth"]
    assert events[1] == ReplicaEjected("r1", 30.0, 42.0, 1)
    assert b.is_ejected(41.9) and not b.is_ejected(42.0)


def test_a_model_slow_on_every_replica_keeps_them_all() -> None:
    policy, replicas = _pool(3, consecutive_timeouts=1)
    for now in (1.0, 2.0, 3.0):
        for replica in replicas:
            events = policy.observe(replica, Outcome.TIMEOUT, now, replicas, started_at=now - 1)
            assert EjectionWithheld(replica.id, "no_other_replica_answered") in events
    assert not any(replica.is_ejected(3.0) for replica in replicas)


def test_ejection_doubles_up_to_the_cap_and_one_success_resets() -> None:
    policy, (a, b) = _pool(2, consecutive_timeouts=1, base_ejection_ms=1000, max_ejection_ms=5000)
    policy.observe(a, Outcome.OK, 1.0, [a, b])
    lengths = []
    now = 2.0
    for _ in range(5):
        events = policy.observe(b, Outcome.TIMEOUT, now, [a, b], started_at=0.5)
        lengths += [event.seconds for event in events if isinstance(event, ReplicaEjected)]
        now = b.ejected_until or now  # the cooldown runs out; it comes back
    assert lengths == [1.0, 2.0, 4.0, 5.0, 5.0]
    events = policy.observe(b, Outcome.OK, now - 1, [a, b])
    assert ReplicaReadmitted("r1", "success") in events
    assert (b.consecutive_timeouts, b.ejection_count, b.is_ejected(now - 1)) == (0, 0, False)


def test_defaults_and_limits_of_the_settings() -> None:
    settings = OutlierDetection()
    assert settings.effective_max_ejection_ms == 300_000
    assert OutlierDetection(base_ejection_ms=600_000).effective_max_ejection_ms == 3_600_000
    assert [settings.max_ejected(n) for n in (1, 2, 3, 4, 10)] == [0, 1, 1, 2, 5]
    assert OutlierDetection(max_ejection_percent=0).max_ejected(5) == 1  # one always can be
    backoffs, step = [], 0.0
    for _ in range(7):
        step = settings.next_backoff_seconds(step)
        backoffs.append(step)
    assert backoffs == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 3.2]
    with pytest.raises(ValueError):
        OutlierDetection(base_ejection_ms=1000, max_ejection_ms=500)


def test_a_single_worker_never_ejects_and_zero_turns_ejection_off() -> None:
    policy, (only,) = _pool(1, consecutive_timeouts=1)
    events = policy.observe(only, Outcome.TIMEOUT, 1.0, [only])
    assert EjectionWithheld("r0", "single_replica") in events
    policy, (a, b) = _pool(2, consecutive_timeouts=0)
    policy.observe(a, Outcome.OK, 1.0, [a, b])
    events = policy.observe(b, Outcome.TIMEOUT, 2.0, [a, b], started_at=0.0)
    assert _kinds(events) == ["ReplicaBackedOff", "ProbeHealth"]  # backoff and probe stay on
