"""R-BAT-6's yield points (`adapters/lane_yield.py`): a forward started under `yielding(gate)` pauses
at a yield point while the gate is held, resumes as soon as the last hold is released, and never
waits longer than the cap at one point; a forward started without a gate (an express forward, a
model without lanes) never pauses; the gate counts holds from several express forwards."""

from __future__ import annotations

import threading
import time

import pytest

from vllm_srun.adapters.lane_yield import YieldGate, yield_point, yielding


def test_a_point_passes_at_once_while_the_gate_is_open_or_absent() -> None:
    gate = YieldGate(cap_s=5.0)
    start = time.perf_counter()
    with yielding(gate):
        yield_point()
    yield_point()  # no gate on this thread
    gate.hold()
    yield_point()  # held, but this thread's forward does not yield
    gate.release()
    assert time.perf_counter() - start < 1.0 and gate.pauses == 0


def test_a_point_waits_while_held_and_resumes_when_the_last_hold_is_released() -> None:
    gate = YieldGate(cap_s=10.0)
    gate.hold()
    gate.hold()  # two express forwards
    passed = threading.Event()

    def slot_forward() -> None:
        with yielding(gate):
            yield_point()
        passed.set()

    thread = threading.Thread(target=slot_forward)
    thread.start()
    deadline = time.monotonic() + 10
    while gate.pauses == 0:  # until the forward waits at its point
        assert time.monotonic() < deadline, "the forward never reached its yield point"
        time.sleep(0.01)
    assert not passed.wait(0.2)
    gate.release()
    assert not passed.wait(0.2)  # one express forward still runs
    gate.release()
    assert passed.wait(5.0)
    thread.join()
    assert gate.pauses == 1 and not gate.held


def test_a_point_never_waits_longer_than_the_cap() -> None:
    gate = YieldGate(cap_s=0.05)
    gate.hold()
    with yielding(gate):
        start = time.perf_counter()
        for _ in range(3):
            yield_point()
        waited = time.perf_counter() - start
    assert 0.1 <= waited < 2.0  # three points, each bounded by the cap


def test_yielding_restores_the_threads_gate_and_a_release_without_hold_is_refused() -> None:
    outer, inner = YieldGate(cap_s=0.05), YieldGate(cap_s=0.01)
    with yielding(outer):
        with yielding(None):
            inner.hold()
            yield_point()  # no gate inside: passes
        outer.hold()
        yield_point()  # the outer gate again: waits at most its cap
    assert outer.pauses == 1 and inner.pauses == 0
    with pytest.raises(ValueError, match="release without a hold"):
        YieldGate().release()
    with pytest.raises(ValueError, match="positive"):
        YieldGate(cap_s=0)
