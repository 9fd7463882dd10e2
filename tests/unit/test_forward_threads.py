"""R-CPU-2's adapter (`ForwardRunner`) with fakes: every forward declares its count before it runs,
the answer returned is always the served one, shadows run after it (queued on the device thread),
and a shadow whose bits differ stops learning for good. No torch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from tests.fakes import FakeClock
from vllm_srun.adapters.serving.forward_threads import ForwardRunner, lone_forward_off, same_answers_at, same_bits
from vllm_srun.domain.scheduling.lanes import Accounting, Lane
from vllm_srun.domain.scheduling.planning import ForwardBatch
from vllm_srun.domain.worker.adaptive_threads import Mode, Phase, ThreadLearner


class FakeContext:
    def __init__(self) -> None:
        self.current: int | None = None
        self.declared: list[int] = []

    def declare(self, threads: int) -> None:
        self.current = threads
        self.declared.append(threads)


class FakeModel:
    """Answers depend on the declared count only where DRIFTS says so; time: 1 ms per token × count (fewer threads are faster)."""

    def __init__(self, context: FakeContext, clock: FakeClock, drifts: frozenset[int] = frozenset()) -> None:
        self.context, self.clock, self.drifts = context, clock, drifts
        self.runs: list[int] = []

    def run(self, lane: str, payloads: Sequence[Any]) -> list[np.ndarray]:
        count = self.context.current
        assert count is not None, "a forward ran before declaring its thread count"
        self.runs.append(count)
        self.clock.advance(1e-3 * sum(payloads) * count)
        bump = np.float32(0.5) if count in self.drifts else np.float32(0)
        return [np.array([p + bump], dtype=np.float32) for p in payloads]


def _batch(tokens: int) -> tuple[ForwardBatch, list[Any]]:
    return ForwardBatch("text", (), tokens, Accounting.PACKED), [tokens]


def _runner(mode: Mode, drifts: frozenset[int] = frozenset()) -> tuple[ForwardRunner, FakeModel, list]:
    clock, context = FakeClock(), FakeContext()
    model = FakeModel(context, clock, drifts)
    queued: list = []
    learner = ThreadLearner(mode, 2, (1, 2), samples=2, window_s=1e6)
    runner = ForwardRunner(
        model.run,
        context=context,
        configured=2,
        learner=learner,
        clock=clock,
        enqueue=lambda fn, *args: queued.append((fn, args)),
    )
    return runner, model, queued


def _drain(queued: list) -> None:
    while queued:
        fn, args = queued.pop(0)
        fn(*args)


def test_shadows_run_after_the_answer_and_never_replace_it() -> None:
    runner, model, queued = _runner(Mode.LEARN)
    runner.golden_done("matched")
    for tokens in (16, 16, 16, 16):
        batch, payloads = _batch(tokens)
        answer = runner.run(batch, payloads)
        assert same_bits(answer, [np.array([tokens], dtype=np.float32)])
        assert model.runs[-1] == 2  # answered at the configured count
        _drain(queued)  # the warm-up rerun, then shadows, after the answer
    learner = runner.learner
    assert learner is not None and learner.phase is Phase.LEARNING
    assert model.runs[:3] == [2, 2, 2]  # served, warm-up rerun at the configured count, served
    assert 1 in model.runs and learner.learned(0) == 1  # 1 thread is faster per token here
    assert runner.card(2, "PASSIVE")["adaptive"]["buckets"][0]["learned"] == 1


def test_a_drifting_count_stops_learning_and_mode_two_keeps_the_configured_count() -> None:
    runner, model, queued = _runner(Mode.SERVE, drifts=frozenset({1}))
    runner.golden_done("matched")
    for _ in range(6):
        batch, payloads = _batch(32)
        answer = runner.run(batch, payloads)
        assert same_bits(answer, [np.array([32], dtype=np.float32)])  # never the drifting bits
        _drain(queued)
    learner = runner.learner
    assert learner is not None and learner.phase is Phase.STOPPED and "drift" in (learner.reason or "")
    served_after = model.runs[-1]
    assert served_after == 2 and model.runs.count(1) == 1  # one shadow at 1 thread, then none


def test_without_golden_nothing_but_the_configured_count_runs() -> None:
    runner, model, queued = _runner(Mode.SERVE)
    runner.golden_done("unverified")
    for _ in range(3):
        runner.run(*_batch(8))
        assert not queued
    assert model.runs == [2, 2, 2]


def test_same_bits_compares_dtype_shape_and_bytes() -> None:
    a = np.array([1.0, -0.0], dtype=np.float32)
    assert same_bits([a, [a]], [a.copy(), [a.copy()]])
    assert not same_bits(a, np.array([1.0, 0.0], dtype=np.float32))  # -0.0 and 0.0 differ in bits
    assert not same_bits(a, a.astype(np.float64)) and not same_bits([a], [a, a])


def _lone_runner(busy: list[int]) -> tuple[ForwardRunner, FakeModel, FakeContext]:
    clock, context = FakeClock(), FakeContext()
    model = FakeModel(context, clock)
    runner = ForwardRunner(
        model.run, context=context, configured=1, learner=None, clock=clock, lone=2, busy=lambda: busy[0]
    )
    return runner, model, context


def test_a_forward_alone_on_the_device_runs_on_the_lone_count_and_one_beside_another_on_its_team() -> None:
    busy = [1]  # the forward itself
    runner, model, _ = _lone_runner(busy)
    runner.run(*_batch(8))
    busy[0] = 2  # another forward runs
    runner.run(*_batch(8))
    busy[0] = 1
    runner.run(*_batch(8))
    assert model.runs == [2, 1, 2] and runner.lone_forwards == 2
    lone = runner.card(2, None)["lone_forward"]
    assert lone == {"threads": 2, "forwards": 2, "reason": None}


def test_a_lone_count_needs_the_devices_busy_count_and_no_learner() -> None:
    clock, context = FakeClock(), FakeContext()
    with pytest.raises(ValueError, match="lone-forward"):
        ForwardRunner(lambda lane, p: p, context=context, configured=1, learner=None, clock=clock, lone=2)
    learner = ThreadLearner(Mode.LEARN, 1, (1, 2), samples=2, window_s=1e6)
    with pytest.raises(ValueError, match="lone-forward"):
        ForwardRunner(
            lambda lane, p: p,
            context=context,
            configured=1,
            learner=learner,
            clock=clock,
            enqueue=lambda *a: None,
            lone=2,
            busy=lambda: 1,
        )


class ProbedModel:
    """A loaded model's probe surface: answers drift at the counts in DRIFTS."""

    def __init__(self, context: FakeContext, rows: list[int], drifts: frozenset[int] = frozenset()) -> None:
        self.inner = FakeModel(context, FakeClock(), drifts)
        self.rows = rows
        self.lanes = [Lane("text")]

    def probe_payloads(self) -> list[int]:
        return self.rows

    def run(self, lane: str, payloads: Sequence[Any]) -> list[np.ndarray]:
        return self.inner.run(lane, payloads)


def test_same_answers_at_compares_every_row_alone_and_together_and_restores_the_first_count() -> None:
    context = FakeContext()
    steady = ProbedModel(context, [3, 5, 8])
    assert same_answers_at(steady, context.declare, [1, 2]) is True  # type: ignore[arg-type]
    assert context.current == 1 and steady.inner.runs == [1, 1, 1, 1, 2, 2, 2, 2]
    drifting = ProbedModel(context, [3, 5], drifts=frozenset({2}))
    assert same_answers_at(drifting, context.declare, [1, 2]) is False  # type: ignore[arg-type]
    assert same_answers_at(ProbedModel(context, []), context.declare, [1, 2]) is None  # type: ignore[arg-type]


def test_the_lone_forward_is_turned_off_by_its_variable_only() -> None:
    assert lone_forward_off({}) is None and lone_forward_off({"VLLM_SRUN_LONE_FORWARD": "1"}) is None
    assert lone_forward_off({"VLLM_SRUN_LONE_FORWARD": "0"}) == "turned off (VLLM_SRUN_LONE_FORWARD=0)"
