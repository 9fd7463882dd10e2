"""R-CPU-1: the forward threads run a nice increment below the rest of the worker, and the
threads a forward starts (OpenMP's team) inherit it; the event loop's thread keeps its priority."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from vllm_srun.adapters.serving.device_thread import BusyCount, DeviceThread, calls_running

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")


def _nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def _nice_of_a_thread_started_here() -> int:
    seen: list[int] = []
    child = threading.Thread(target=lambda: seen.append(_nice()))
    child.start()
    child.join()
    return seen[0]


def test_device_threads_run_below_the_callers_priority_and_pass_it_on() -> None:
    base = _nice()
    if base > 19 - 3:
        pytest.skip("this process already runs at the lowest priority")
    device = DeviceThread(workers=2, nice=3)
    try:
        assert device.nice == 3
        assert device.call(_nice) == base + 3
        assert device.call(_nice_of_a_thread_started_here) == base + 3  # e.g. an OpenMP team member
        started = threading.Barrier(2)  # both threads busy at once: the second thread exists too

        def both() -> int:
            started.wait(timeout=10)
            return _nice()

        futures = [device.enqueue(both) for _ in range(2)]
        assert [f.result(timeout=10) for f in futures] == [base + 3, base + 3]
        assert _nice() == base  # the caller (the event loop's thread) is untouched
    finally:
        device.shutdown()


def test_no_increment_leaves_the_priority_alone_and_a_bad_one_is_refused() -> None:
    device = DeviceThread(nice=0)
    try:
        assert device.call(_nice) == _nice()
    finally:
        device.shutdown()
    for bad in (-1, 20):
        with pytest.raises(ValueError, match="nice"):
            DeviceThread(nice=bad)


def test_every_device_thread_starts_when_the_device_is_made_not_at_some_later_burst() -> None:
    started: list[tuple[int, int]] = []
    device = DeviceThread(workers=3, initializer=lambda: started.append((threading.get_ident(), _nice())), nice=2)
    try:
        assert len({ident for ident, _ in started}) == 3  # before any call: each ran its initializer
        assert {nice for _, nice in started} == {min(19, _nice() + 2)}
    finally:
        device.shutdown()


def test_busy_counts_the_calls_running_now_each_counting_itself() -> None:
    device = DeviceThread(workers=2)
    try:
        assert device.busy() == 0
        assert device.call(device.busy) == 1
        both = threading.Barrier(2)

        def seen_together() -> int:
            both.wait(timeout=10)
            seen = device.busy()
            both.wait(timeout=10)  # neither leaves before both have looked
            return seen

        futures = [device.enqueue(seen_together) for _ in range(2)]
        assert [f.result(timeout=10) for f in futures] == [2, 2]
        assert device.busy() == 0
    finally:
        device.shutdown()


def test_calls_running_adds_up_the_devices_there() -> None:
    """The lone-forward count asks the slots' threads and the express thread together (R-FAIR-7):
    a forward that starts beside an express forward is not alone."""
    slots, express = DeviceThread(workers=2), DeviceThread("express")
    try:
        assert calls_running(slots, None) == 0
        both = threading.Barrier(2)

        def seen_together() -> int:
            both.wait(timeout=10)
            seen = calls_running(slots, express, None)
            both.wait(timeout=10)
            return seen

        futures = [slots.enqueue(seen_together), express.enqueue(seen_together)]
        assert [f.result(timeout=10) for f in futures] == [2, 2]
    finally:
        slots.shutdown()
        express.shutdown()


def test_busy_count_adds_the_express_thread_once_it_is_made() -> None:
    """The loader hands a forward its device's `BusyCount` before the express thread exists; the
    express thread's calls count from when it is added."""
    slots, express = DeviceThread(workers=2), DeviceThread("express")
    try:
        count = BusyCount(slots)
        assert count() == 0
        assert express.call(count) == 0  # not added yet: the express thread's call is not counted
        count.add(express)
        assert express.call(count) == 1
        assert slots.call(count) == 1
    finally:
        slots.shutdown()
        express.shutdown()
