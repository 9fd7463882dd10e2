"""R-CPU-2: the adaptive-thread learner against fake timings and a fake clock (pure domain).

A fake host says how many seconds per token each thread count costs in each size bucket and
whether a count reproduces the served answer's bits; the state machine plays forwards through
the learner the way `adapters/serving/forward_threads.py` does and checks the rules at every step.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from tests.fakes import FakeClock
from vllm_srun.domain.worker.adaptive_threads import (
    ADAPTIVE_ENV,
    BUCKET_EDGES,
    Mode,
    Phase,
    ThreadLearner,
    bucket_label,
    bucket_of,
    candidate_counts,
    parse_mode,
)

TOKENS = st.integers(1, 6000)


def test_the_mode_is_parsed_and_refused_in_one_line_naming_the_variable() -> None:
    assert parse_mode(None) is Mode.OFF and parse_mode(" ") is Mode.OFF
    assert parse_mode("1") is Mode.LEARN and parse_mode(" 2 ") is Mode.SERVE and parse_mode("0") is Mode.OFF
    for bad in ("3", "on", "-1", "1.0", "two"):
        with pytest.raises(ValueError, match=f"^{ADAPTIVE_ENV}: expected one of 0, 1, 2") as info:
            parse_mode(bad)
        assert "\n" not in str(info.value)


@given(st.integers(1, 64), st.integers(1, 64))
def test_candidates_include_one_the_configured_count_and_never_pass_the_budget(configured: int, budget: int) -> None:
    configured = min(configured, budget)
    counts = candidate_counts(configured, budget)
    assert counts == tuple(sorted(set(counts)))
    assert 1 in counts and configured in counts and budget in counts and max(counts) == budget


@given(TOKENS)
def test_buckets_cover_every_size_in_order(tokens: int) -> None:
    index = bucket_of(tokens)
    label = bucket_label(index)
    low, _, high = label.rstrip("+").partition("-")
    assert int(low) <= tokens and (label.endswith("+") or tokens <= int(high))
    assert bucket_of(max(0, tokens - 1)) <= index <= len(BUCKET_EDGES)


class FakeHost:
    """Seconds per token of each count in each bucket, and the counts that drift (in a bucket)."""

    def __init__(self, costs: dict[int, dict[int, float]], drifting: set[tuple[int, int]]) -> None:
        self.costs, self.drifting = costs, drifting

    def seconds(self, tokens: int, count: int) -> float:
        return self.costs[bucket_of(tokens)][count] * tokens

    def matches(self, tokens: int, count: int) -> bool:
        return (bucket_of(tokens), count) not in self.drifting


class LearnerMachine(RuleBasedStateMachine):
    @initialize(
        mode=st.sampled_from([Mode.LEARN, Mode.SERVE]),
        budget=st.integers(2, 8),
        configured_at=st.integers(0, 7),
        seed_costs=st.lists(st.floats(1e-6, 1e-3), min_size=5 * 8, max_size=5 * 8),
        drift=st.booleans(),
        drift_at=st.tuples(st.integers(0, 4), st.integers(1, 8)),
    )
    def setup(
        self,
        mode: Mode,
        budget: int,
        configured_at: int,
        seed_costs: list[float],
        drift: bool,
        drift_at: tuple[int, int],
    ) -> None:
        configured = 1 + configured_at % budget
        self.clock = FakeClock()
        counts = candidate_counts(configured, budget)
        costs = {b: {c: seed_costs[b * 8 + i] for i, c in enumerate(counts)} for b in range(len(BUCKET_EDGES) + 1)}
        drifting = {drift_at} if drift and drift_at[1] in counts and drift_at[1] != configured else set()
        self.host = FakeHost(costs, drifting)
        self.learner = ThreadLearner(mode, configured, counts, samples=3, window_s=100.0)
        self.mode, self.configured = mode, configured
        self.golden_passed = False
        self.warmed = False
        self.drifted = False
        self.forwards_after_stop = 0

    @rule()
    def golden(self) -> None:
        self.learner.golden_passed()
        self.golden_passed = True

    @rule(tokens=TOKENS, later=st.floats(0, 30))
    def forward(self, tokens: int, later: float) -> None:
        self.clock.advance(later)
        learner = self.learner
        plan = learner.plan(tokens, self.clock.now())
        assert plan.serve in learner.candidates
        if not self.golden_passed:
            assert plan == type(plan)(self.configured), "nothing is explored before the golden check passed"
        if self.mode is Mode.LEARN or self.drifted or not self.warmed:
            assert plan.serve == self.configured, "mode 1, a drift or no warm-up: the configured count answers"
        if plan.serve != self.configured:
            bucket = bucket_of(tokens)
            assert learner.learned(bucket) == plan.serve, "only a learned count serves"
            assert all(learner.buckets[bucket].samples(c) >= learner.samples for c in learner.candidates), (
                "a count serves only after every candidate's shadows matched there"
            )
        assert len(plan.shadows) <= 1 and plan.serve not in plan.shadows
        if plan.shadows or plan.warm_up:
            assert not self.drifted, "learning stops for good on the first drift"
            assert learner.window_ends is None or self.clock.now() < learner.window_ends
        if plan.shadows:
            assert self.warmed, "no shadow before the warm-up at the configured count"
        learner.served(tokens, plan.serve, self.host.seconds(tokens, plan.serve))
        if plan.warm_up:
            assert plan.serve == self.configured and not self.warmed
            learner.warmed_up(True, self.clock.now())
            self.warmed = True
        for count in plan.shadows:
            matched = self.host.matches(tokens, count)
            learner.shadow(tokens, count, self.host.seconds(tokens, count), matched)
            if not matched:
                self.drifted = True

    @invariant()
    def stopped_after_drift(self) -> None:
        if getattr(self, "drifted", False):
            assert self.learner.phase is Phase.STOPPED and self.learner.reason and "drift" in self.learner.reason

    @invariant()
    def learned_counts_are_the_fastest(self) -> None:
        learner = getattr(self, "learner", None)
        if learner is None:
            return
        for bucket in learner.buckets:
            best = learner.learned(bucket)
            if best is None:
                continue
            costs = self.host.costs[bucket]
            fastest = min(costs.values())
            if best != self.configured:
                assert costs[best] == fastest
                assert costs[best] <= costs[self.configured] * (1 - learner.margin)
            else:
                assert fastest > costs[self.configured] * (1 - learner.margin)


TestLearner = LearnerMachine.TestCase
TestLearner.settings = settings(max_examples=150, stateful_step_count=80, deadline=None)


@given(st.sampled_from([Mode.LEARN, Mode.SERVE]))
def test_the_window_closes_and_the_table_freezes(mode: Mode) -> None:
    clock = FakeClock()
    learner = ThreadLearner(mode, 2, (1, 2), samples=2, window_s=10.0)
    learner.golden_passed()
    assert learner.plan(100, clock.now()).warm_up
    learner.warmed_up(True, clock.now())
    assert learner.plan(100, clock.now()).shadows == (1,)
    clock.advance(10.0)
    assert learner.plan(100, clock.now()).shadows == ()
    assert learner.phase is Phase.LEARNED and "window" in (learner.reason or "")


def test_a_golden_check_that_did_not_pass_explores_nothing() -> None:
    learner = ThreadLearner(Mode.SERVE, 2, (1, 2))
    learner.golden_not_passed("unverified")
    plan = learner.plan(100, 0.0)
    assert plan.serve == 2 and not plan.shadows and not plan.warm_up
    assert learner.phase is Phase.STOPPED and "unverified" in (learner.reason or "")


def test_a_warm_up_that_does_not_reproduce_itself_stops_learning() -> None:
    learner = ThreadLearner(Mode.LEARN, 2, (1, 2))
    learner.golden_passed()
    learner.warmed_up(False, 0.0)
    assert learner.phase is Phase.STOPPED and learner.plan(50, 1.0).shadows == ()


def test_mode_two_serves_the_faster_count_once_learned_and_the_table_says_so() -> None:
    learner = ThreadLearner(Mode.SERVE, 2, (1, 2), samples=2, window_s=1e9)
    learner.golden_passed()
    learner.warmed_up(True, 0.0)
    for _ in range(4):
        plan = learner.plan(32, 0.0)
        learner.served(32, plan.serve, 32 * 2e-6)
        for count in plan.shadows:
            learner.shadow(32, count, 32 * 1e-6, True)  # 1 thread is twice as fast on short forwards
    assert learner.learned(bucket_of(32)) == 1 and learner.plan(32, 0.0).serve == 1
    assert learner.plan(2000, 0.0).serve == 2  # another bucket: not learned yet
    row = learner.table()["buckets"][0]
    assert (
        row["tokens"] == "0-63" and row["learned"] == 1 and row["samples"] == {"1": 4, "2": 2}
    )  # served forwards at 1 count too
