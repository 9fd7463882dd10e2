"""The device thread: every forward of a process runs here, off the event loop (one OpenMP team
on a CPU; on a GPU, one lock per device serialises launches).

It knows nothing of torch: each forward declares its thread count in the process's thread
context just before it runs (`serving/forward_threads.py`, `engines/threads.py`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from typing import Any


class DeviceThread:
    def __init__(self, name: str = "srun-device") -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=name, initializer=self._init
        )
        self.ident: int | None = None

    def _init(self) -> None:
        self.ident = threading.get_ident()

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
