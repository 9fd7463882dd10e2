"""Waiting in tests for something to have happened, instead of sleeping a fixed time and hoping.

`wait_until(predicate, timeout=..., what=...)` polls PREDICATE until it returns something truthy
(returned) and fails with WHAT when TIMEOUT seconds pass first; `until` is its twin for a test
on an event loop (the loop keeps running between polls). The timeout is a bound on a bug, not a
guess at how long the thing takes: the wait ends as soon as the condition holds.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
POLL_S = 0.01


def wait_until(
    predicate: Callable[[], T], *, timeout: float = 10.0, what: str | Callable[[], str], poll_s: float = POLL_S
) -> T:
    """PREDICATE's first truthy value; AssertionError naming WHAT (a text, or a function that says
    what was seen instead) after TIMEOUT seconds."""
    deadline = time.monotonic() + timeout
    while True:
        found = predicate()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(_missed(what, timeout))
        time.sleep(poll_s)


async def until(
    predicate: Callable[[], T | Awaitable[T]],
    *,
    timeout: float = 10.0,
    what: str | Callable[[], str],
    poll_s: float = POLL_S,
) -> T:
    """`wait_until` on an event loop: the loop runs other tasks between polls. PREDICATE may be a
    coroutine function (say, a blocking probe run with `asyncio.to_thread`)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        found = await value if inspect.isawaitable(value) else value
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(_missed(what, timeout))
        await asyncio.sleep(poll_s)


def _missed(what: str | Callable[[], str], timeout: float) -> str:
    return f"{what if isinstance(what, str) else what()}: not reached in {timeout:g} s"


def exited(pid: int) -> bool:
    """The process is gone or a zombie (it has exited; its parent has not reaped it yet)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state == "Z"
