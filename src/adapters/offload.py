"""Request preparation off the event loop (R-API-9: a large or hostile request never stalls the
others): a bounded pool of threads for the CPU work between a request's bytes and its rows —
decompressing and decoding the body, tokenizing, cutting overflow windows — and for encoding a
large answer.

- Work for a body under `INLINE_BYTES` runs on the loop: a hop to a thread costs more than the
  work. The caller says the body's size (`hand_off(..., size=)`: a request's is its `Call.body_bytes`,
  which `ServedModel.prepare` passes on, so the surfaces need not know it).
- Larger work runs on one of `threads` threads (`domain.worker.threads.preparation_threads`: a quarter
  of the forward threads, at least 1, at most 4) running at a lower priority (nice 10), so it
  cannot take the CPUs the forwards and the loop need; the worker tells the `tokenizers`
  library to stay on the calling thread (`TOKENIZERS_PARALLELISM`).
  At most `max_waiting` jobs wait or run; past that a request gets 429 `overloaded`.
- After a large request, `release_memory()` collects garbage cycles and hands the heap its work
  freed back to the OS (glibc `malloc_trim`, on a pool thread, 0.2 s later and at most once per 5 s: a trim holds
  the allocator's locks for milliseconds), so a worker's memory returns to where it was
  instead of staying at its peak.
"""

from __future__ import annotations

import asyncio
import contextvars
import ctypes
import gc
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from vllm_srun.domain.errors import Overloaded

log = logging.getLogger("vllm_srun.offload")
T = TypeVar("T")
INLINE_BYTES = 16 * 1024
TRIM_BYTES = 1024 * 1024  # a request this large releases freed memory when it is done
TRIM_DELAY_S = 0.2
TRIM_INTERVAL_S = 5.0  # a trim holds the allocator's locks for 5-70 ms: at most one per interval
WAITING_PER_THREAD = 16
PREPARING_NICE = 10
# While a large request is prepared on a pool thread, the event loop waits for the GIL up to one
# switch interval each time it wakes (CPython's default is 5 ms); the worker and the front set
# 1 ms so /health/live and small requests stay prompt (bench/soak.py).
SWITCH_INTERVAL_S = 0.001


def _lower_priority() -> None:
    """A preparing thread yields the CPU to the event loop and the forwards when they compete
    (nice 10 on Linux, where each thread has its own priority; lowering it needs no privilege)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), PREPARING_NICE)
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        pass


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(None)
        trim: Callable[[int], int] = libc.malloc_trim  # glibc only
    except (OSError, AttributeError):
        return None
    return trim


class Offload:
    def __init__(self, threads: int, *, inline_bytes: int = INLINE_BYTES, max_waiting: int | None = None) -> None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.threads = threads
        self.inline_bytes = inline_bytes
        self.max_waiting = max_waiting if max_waiting is not None else WAITING_PER_THREAD * threads
        self.waiting = 0
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="srun-prepare", initializer=_lower_priority)
        self._trim = _malloc_trim()
        self._trim_scheduled = False
        self._last_trim = -TRIM_INTERVAL_S

    async def hand_off(self, fn: Callable[..., T], *args: Any, size: int) -> T:
        """FN(*ARGS): on the loop when SIZE (the bytes of the request it prepares) is small, else
        on the pool (with the caller's context variables); 429 when the pool is backed up."""
        if size < self.inline_bytes:
            return fn(*args)
        if self.waiting >= self.max_waiting:
            raise Overloaded(f"{self.waiting} large requests are being prepared; retry")
        self.waiting += 1
        try:
            context = contextvars.copy_context()
            return await asyncio.wrap_future(self._executor.submit(context.run, fn, *args))
        finally:
            self.waiting -= 1

    def release_memory(self) -> None:
        """Soon, on the pool: return the heap's free memory to the OS (no-op without glibc)."""
        if self._trim is None or self._trim_scheduled:
            return
        self._trim_scheduled = True
        loop = asyncio.get_running_loop()
        delay = max(TRIM_DELAY_S, self._last_trim + TRIM_INTERVAL_S - loop.time())
        loop.call_later(delay, self._submit_trim)

    def _submit_trim(self) -> None:
        self._trim_scheduled = False
        self._last_trim = asyncio.get_running_loop().time()
        try:
            self._executor.submit(self._trim_now)
        except RuntimeError:  # shut down
            pass

    def _trim_now(self) -> None:
        gc.collect()  # cycles that still hold a large request's bytes (a full collection: idle servers run none)
        if self._trim is not None:
            self._trim(0)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
