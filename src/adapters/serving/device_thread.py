"""The device thread: every forward of a process runs here, off the event loop (one OpenMP team
on a CPU; on a GPU, one lock per device serialises launches).

A CPU worker may run several forwards side by side (`--concurrent-forwards N`, R-CPU-1): the
device then has N threads, each running one forward at a time on its own OpenMP team of
threads ÷ N (`workers`); loading, warm-up and the readiness checks take one of them.

It knows nothing of torch: each forward declares its thread count in the process's thread
context just before it runs (`serving/forward_threads.py`, `engines/threads.py`); INITIALIZER
runs once on each of the device's threads when it starts.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import Any


class DeviceThread:
    def __init__(
        self, name: str = "srun-device", *, workers: int = 1, initializer: Callable[[], None] | None = None
    ) -> None:
        if workers < 1:
            raise ValueError(f"a device runs at least 1 forward at a time, got {workers}")
        self.workers = workers
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix=name, initializer=initializer
        )

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, fn, *args)

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Blocking call from a non-loop thread (loading, warm-up, golden checks)."""
        return self._pool.submit(fn, *args).result()

    def submit(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future:
        """Queue a call without waiting for it (from any thread, the device thread included: it
        runs after the calls queued before it)."""
        return self._pool.submit(fn, *args)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
