"""The one deadline-vs-disconnect race of a request, used by the worker and the front alike.

`await race(work, deadline_s=..., disconnected=...)` runs WORK inside an anyio cancel scope
whose deadline is the request's; a watcher waits for the client to go away and cancels the
scope. Whatever ends first wins:
- WORK finished: its result (or its exception, unchanged);
- the client went away: WORK is cancelled, then `Cancelled` (logged as 499);
- the deadline passed: WORK is cancelled, then `DeadlineExceeded` with the caller's message.
Cancelling WORK is what drops a request's queued rows on a worker (the scheduler loop's
`submit`) and closes the worker connection on the front (the worker then drops them too).
A cancellation from outside (server shutdown) propagates as usual.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import anyio

from vllm_srun.domain.errors import Cancelled, DeadlineExceeded

T = TypeVar("T")
Receive = Callable[[], Awaitable[Mapping[str, Any]]]


async def wait_disconnect(receive: Receive) -> None:
    """Return once the ASGI client has gone away (`http.disconnect`)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def race(
    work: Callable[[], Awaitable[T]],
    *,
    deadline_s: float | None,
    disconnected: Callable[[], Awaitable[object]] | None,
    deadline_message: str,
) -> T:
    gone = False
    deadline = math.inf if deadline_s is None else anyio.current_time() + deadline_s
    with anyio.CancelScope(deadline=deadline) as scope:

        async def watch(wait: Callable[[], Awaitable[object]]) -> None:
            nonlocal gone
            await wait()
            gone = True
            scope.cancel()

        watcher = asyncio.ensure_future(watch(disconnected)) if disconnected is not None else None
        try:
            return await work()
        finally:
            if watcher is not None:
                watcher.cancel()
    if gone:
        raise Cancelled("the client went away")
    raise DeadlineExceeded(deadline_message)
