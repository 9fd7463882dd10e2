"""Paced reads (R-FAIR-5): the connections whose next request waits unread while their tenant is
over its share, read in the order they were held as the tenant's own requests finish. The rule
that decides who waits is the pure `domain/scheduling/read_pacing.py`; `guarded_protocol.py` holds a
connection's bytes while it waits (reading paused: the rest stays in the kernel) and counts each
request in progress from when it is read (or its tenant is known) until its response completes
or the connection is lost; `http/auth.py`'s middleware reports which tenant a request is.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

from vllm_srun.domain.scheduling.read_pacing import FLOOR, ReadPacing
from vllm_srun.domain.scheduling.tenants import DEFAULT_TENANTS

CONNECTION_SCOPE_KEY = "srun_connection"  # the request's connection (a `PacedConnection`), in its ASGI scope


class Held(Protocol):
    def release(self) -> bool:
        """Read the request this connection holds; False when it went meanwhile (nothing read)."""
        ...


class PacedConnection(Protocol):
    """What the middleware tells a request's connection (`GuardedProtocol`)."""

    def request_started(self, tenant: str, *, bind: bool) -> None:
        """A request of TENANT is being served (until its response completes or the connection
        is lost); BIND: the tenant came from the client's key, so this connection's next
        requests are the same tenant's."""
        ...


class PacedReads:
    """One process's paced reads, shared by its listeners: the requests in progress by tenant
    (`domain/scheduling/read_pacing.py`) and, per tenant, the connections whose next request waits unread,
    read in the order they were held, one per loop turn, whenever one of the tenant's own
    requests finishes and the tenant is no longer paced."""

    def __init__(
        self,
        weight: Callable[[str], float] = DEFAULT_TENANTS.weight,
        clock: Callable[[], float] = time.monotonic,
        floor: int = FLOOR,
    ) -> None:
        self.pacing = ReadPacing(weight, floor=floor)
        self.clock = clock
        self.held = 0  # requests held so far (a counter for the metrics)
        self._waiting: dict[str, deque[Held]] = {}
        self._scheduled: set[str] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    def started(self, tenant: str) -> None:
        self.pacing.started(tenant, self.clock())

    def finished(self, tenant: str) -> None:
        self.pacing.finished(tenant)
        if tenant in self._waiting:
            self._schedule(tenant)

    def should_hold(self, tenant: str) -> bool:
        """Whether a request of TENANT that arrives now waits unread: TENANT is paced, or others of
        its requests wait already (a tenant's requests are read in the order they came)."""
        return tenant in self._waiting or self.pacing.paced(tenant, self.clock())

    def waiting(self, tenant: str) -> int:
        """Connections of TENANT whose request waits unread."""
        return len(self._waiting.get(tenant, ()))

    def hold(self, connection: Held, tenant: str, loop: asyncio.AbstractEventLoop) -> None:
        """CONNECTION's next request waits unread, after TENANT's already waiting: read once one
        of TENANT's requests finishes and TENANT is no longer paced (a paced tenant holds a
        request, so that finish comes)."""
        self._loop = loop
        self._waiting.setdefault(tenant, deque()).append(connection)
        self.held += 1

    def forget(self, connection: Held, tenant: str) -> None:
        """CONNECTION no longer waits (its client half-closed, so it is read now, or it went)."""
        queue = self._waiting.get(tenant)
        if queue is not None and connection in queue:
            queue.remove(connection)
            if not queue:
                del self._waiting[tenant]

    def _schedule(self, tenant: str) -> None:
        if tenant not in self._scheduled and self._loop is not None:
            self._scheduled.add(tenant)
            self._loop.call_soon(self._release, tenant)

    def _release(self, tenant: str) -> None:
        """Read TENANT's longest-waiting request if TENANT is not paced; the next one a loop turn
        later (reading one counts it in progress, which may pace the tenant again)."""
        self._scheduled.discard(tenant)
        queue = self._waiting.get(tenant)
        while queue and not self.pacing.paced(tenant, self.clock()):
            if queue.popleft().release():
                break
        if not queue:
            self._waiting.pop(tenant, None)
        elif not self.pacing.paced(tenant, self.clock()):
            self._schedule(tenant)
