"""One listener's connections (R-API-9): the pure table of `domain/security/connections.py`, the timer
that expires connections past their deadline, the answers the guard writes itself, and counts
by reason for the metrics. The protocol that reports to it is `guarded_protocol.py`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from functools import partial
from typing import Protocol

from vllm_srun.adapters.http.errors import raw_error_response
from vllm_srun.adapters.http.read_pacing import PacedReads
from vllm_srun.adapters.prometheus import Counter, Gauge
from vllm_srun.domain.scheduling.read_pacing import FLOOR
from vllm_srun.domain.scheduling.tenants import DEFAULT_TENANTS, TenantTable
from vllm_srun.domain.security.connections import (
    ConnectionAdmission,
    ConnectionLimits,
    ConnectionPhase,
    ConnectionTable,
    Expiry,
)

log = logging.getLogger("vllm_srun.connections")
REFUSAL_LOG_S = 10.0
QUIET_PEAK = 64
OnClose = Callable[[str], None]  # the reason a connection was closed by the guard (metrics)


class Guarded(Protocol):
    """What the guard needs of a connection it tracks (`guarded_protocol.GuardedProtocol`)."""

    def __hash__(self) -> int: ...

    def expire(self, expiry: Expiry) -> None:
        """Close the connection: it is past its deadline (EXPIRY says which one)."""
        ...

    def evict(self) -> None:
        """Close the connection: a newer one took its place in a full table."""
        ...


class ConnectionGuard:
    """The connections of one listener: their table, the timer that expires them, counts by reason."""

    def __init__(
        self,
        limits: ConnectionLimits,
        on_close: OnClose | None = None,
        on_quiet: Callable[[], None] | None = None,
        reads: PacedReads | None = None,
    ) -> None:
        self.limits = limits
        self.reads = reads or PacedReads()  # whose next request waits its turn (R-FAIR-5)
        self.table: ConnectionTable[Guarded] = ConnectionTable(limits)
        self.on_close = on_close or (lambda reason: None)
        self.on_quiet = on_quiet or (lambda: None)  # many connections went: their memory can go back to the OS
        self._peak = 0
        self.closed: dict[str, int] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._last_refusal_log = -math.inf
        self.too_large = raw_error_response(
            "headers_too_large", f"the request head is larger than {limits.max_header_bytes} bytes"
        )
        self.head_late = raw_error_response(
            "request_timeout", f"the request head did not arrive within {limits.header_timeout_s:g} s"
        )
        self.body_late = raw_error_response(
            "request_timeout", f"the request body did not arrive within {limits.body_timeout_s:g} s"
        )
        self.refused = raw_error_response(
            "too_many_connections",
            f"the server holds {limits.max_connections} connections, each with a request in progress; retry",
            b"retry-after: 1\r\n",
        )

    def count(self, reason: str) -> None:
        self.closed[reason] = self.closed.get(reason, 0) + 1
        self.on_close(reason)

    def log_refusal(self) -> None:
        """One warning per REFUSAL_LOG_S at most, with the count since the last one."""
        now = time.monotonic()
        if now - self._last_refusal_log >= REFUSAL_LOG_S:
            self._last_refusal_log = now
            log.warning(
                "refusing connections: %d open, each with a request in progress (%d refused so far)",
                len(self.table),
                self.closed.get("refused", 0),
            )

    def admit(self, protocol: Guarded, loop: asyncio.AbstractEventLoop) -> ConnectionAdmission[Guarded]:
        admission = self.table.open(protocol, loop.time())
        self._peak = max(self._peak, len(self.table))
        if self._timer is None:
            self._timer = loop.call_later(self.limits.tick_s, self._sweep, loop)
        return admission

    def forget(self, protocol: Guarded) -> None:
        """A connection is gone; after a crowd of them has gone (a quarter of a peak of 64 or more
        is left), `on_quiet`."""
        self.table.close(protocol)
        if self._peak >= QUIET_PEAK and len(self.table) <= self._peak // 4:
            self._peak = len(self.table)
            self.on_quiet()

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        for protocol, expiry in self.table.expired(loop.time()):
            protocol.expire(expiry)
        self._timer = loop.call_later(self.limits.tick_s, self._sweep, loop) if len(self.table) else None


class ConnectionMetrics(Protocol):
    """What a registry offers the guard (`RuntimeMetrics`, `FrontMetrics`)."""

    @property
    def open_connections(self) -> Gauge: ...

    @property
    def connections_closed(self) -> Counter: ...


def watched_guard(
    limits: ConnectionLimits | None,
    metrics: ConnectionMetrics,
    on_quiet: Callable[[], None] | None = None,
    tenants: TenantTable = DEFAULT_TENANTS,
    floor: int = FLOOR,
) -> ConnectionGuard:
    """A guard whose open connections and closes by reason are in METRICS; requests are paced
    by TENANTS' weights, a tenant always holding up to FLOOR (R-FAIR-5)."""
    guard = ConnectionGuard(
        limits or ConnectionLimits(),
        lambda reason: metrics.connections_closed.inc({"reason": reason}),
        on_quiet,
        PacedReads(tenants.weight, floor=floor),
    )
    for phase in ConnectionPhase:
        metrics.open_connections.set_function(partial(_count, guard, phase), {"phase": phase.value})
    return guard


def _count(guard: ConnectionGuard, phase: ConnectionPhase) -> float:
    return float(guard.table.count(phase))
