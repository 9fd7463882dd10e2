"""R-CPU-2's adapter (`ForwardRunner`) with fakes: every forward declares its count before it runs,
the answer returned is always the served one, shadows run after it (queued on the device thread),
and a shadow whose bits differ stops learning for good. No torch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tests.fakes import FakeClock
from vllm_srun.adapters.serving.forward_threads import ForwardRunner, same_bits
from vllm_srun.domain.adaptive_threads import Mode, Phase, ThreadLearner
from vllm_srun.domain.lanes import Accounting
from vllm_srun.domain.planning import ForwardBatch


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
        submit=lambda fn, *args: queued.append((fn, args)),
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
