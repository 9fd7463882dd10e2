"""The device thread: every forward of a process runs here, off the event loop (one OpenMP team
on a CPU; on a GPU, one lock per device serialises launches).

A CPU worker may run several forwards side by side (`--concurrent-forwards N`, R-CPU-1): the
device then has N threads, each running one forward at a time on its own OpenMP team of
threads ÷ N (`workers`); loading, warm-up and the readiness checks take one of them.

It knows nothing of torch: each forward declares its thread count in the process's thread
context just before it runs (`serving/forward_threads.py`, `engines/threads.py`); INITIALIZER
runs once on each of the device's threads, all started when the device is made.

NICE lowers the device threads' CPU priority below the rest of the process (Linux: a thread's
nice value is its own, and the OpenMP threads a forward starts inherit it), so the event loop
and request preparation run first when both are ready (`domain.worker.threads.forward_nice`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


def lower_thread_priority(increment: int) -> None:
    """Raise the calling thread's nice value by INCREMENT (at most to 19); nothing where the
    platform has no per-thread priority, a warning where it refuses."""
    if increment <= 0 or not sys.platform.startswith("linux"):
        return
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + increment))
    except OSError:
        log.warning("could not lower the forward thread's priority", exc_info=True)


def calls_running(*devices: DeviceThread | None) -> int:
    """Calls running now on the threads of DEVICES (None: a device that is not there)."""
    return sum(device.busy() for device in devices if device is not None)


class BusyCount:
    """Calls running now on one device's threads, its express thread's too once it is made
    (`add`): what a forward asks before it runs (`ForwardRunner`'s lone count)."""

    def __init__(self, device: DeviceThread) -> None:
        self._devices: list[DeviceThread] = [device]

    def add(self, device: DeviceThread) -> None:
        self._devices.append(device)

    def __call__(self) -> int:
        return calls_running(*self._devices)


class DeviceThread:
    def __init__(
        self,
        name: str = "srun-device",
        *,
        workers: int = 1,
        initializer: Callable[[], None] | None = None,
        nice: int = 0,
    ) -> None:
        if workers < 1:
            raise ValueError(f"a device runs at least 1 forward at a time, got {workers}")
        if not 0 <= nice <= 19:
            raise ValueError(f"a nice increment is 0..19, got {nice}")
        self.workers = workers
        self.nice = nice if sys.platform.startswith("linux") else 0  # what the card reports
        self._initializer = initializer
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix=name, initializer=self._start_thread
        )
        self._busy = 0
        self._busy_lock = threading.Lock()
        self._start_every_thread()

    def _start_every_thread(self) -> None:
        """Start all WORKERS threads now: an executor starts one only when no idle thread can
        take a call, so under light load the second would start at some later burst, its
        initializer and priority change running in the middle of serving (or never)."""
        if self.workers == 1:
            return
        met = threading.Barrier(self.workers)
        for future in [self._pool.submit(met.wait, 60.0) for _ in range(self.workers)]:
            future.result()

    def _start_thread(self) -> None:
        lower_thread_priority(self.nice)
        if self._initializer is not None:
            self._initializer()

    def _counted(self, fn: Callable[..., Any], *args: Any) -> Any:
        with self._busy_lock:
            self._busy += 1
        try:
            return fn(*args)
        finally:
            with self._busy_lock:
                self._busy -= 1

    def busy(self) -> int:
        """How many of the device's threads are running a call now (a call counts itself)."""
        return self._busy

    async def hand_off(self, fn: Callable[..., Any], *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._counted, fn, *args)

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Blocking call from a non-loop thread (loading, warm-up, golden checks)."""
        return self._pool.submit(self._counted, fn, *args).result()

    def enqueue(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future:
        """Queue a call without waiting for it (from any thread, the device thread included: it
        runs after the calls queued before it)."""
        return self._pool.submit(self._counted, fn, *args)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
