"""Connection hygiene as a pure policy (R-API-9: a hostile client never affects other requests):
which client connections a server keeps, for how long, and which one gives way at the cap.

Every open connection is in one phase, each with its deadline:
- FRESH: opened, nothing received yet: its first request head must arrive within
  `header_timeout` of the opening (an idle socket is closed quietly);
- HEAD: a request head is arriving: within `header_timeout` of the opening (a fresh
  connection) or of the head's first byte (a kept-alive one); past it, 408;
- BODY: the head arrived, the body is arriving: within `body_timeout` of the head; past it, 408;
- BUSY: the request is with the application, or held unread while its tenant is paced
  (R-FAIR-5, `held`; `read_resumed` makes it a head again): no deadline (the request's own deadline rules),
  except that a response the client stops reading is given up `body_timeout` after the writes
  stalled (in any phase: an answer may sit unread after the application is done with it);
- IDLE: kept alive between requests: closed quietly after `keep_alive_timeout`.

At `max_connections` a new connection first takes the place of the longest-idle *evictable*
connection (FRESH, IDLE or HEAD: nothing of theirs is with the application yet), so sockets
that sit idle, or dribble a head, never lock out clients that send requests; only when every
connection has a request in progress is the new one refused (the adapter answers 503).

The adapter (`adapters/http/guarded_protocol.py`) reports the transitions and asks `expired(now)`
on a timer; time comes in as numbers, so the policy is tested without sockets or clocks.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypeVar

from vllm_srun.domain.settings import bounds

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    header_timeout_s: float = bounds.HEADER_TIMEOUT.default
    keep_alive_timeout_s: float = bounds.KEEP_ALIVE_TIMEOUT.default
    body_timeout_s: float = bounds.BODY_TIMEOUT.default
    max_header_bytes: int = bounds.MAX_HEADER_BYTES.default
    max_connections: int = bounds.MAX_CONNECTIONS.default

    def valued(self) -> list[tuple[bounds.Setting[Any], object]]:
        """Every setting with its value (flags, `problems`)."""
        return [
            (bounds.HEADER_TIMEOUT, self.header_timeout_s),
            (bounds.KEEP_ALIVE_TIMEOUT, self.keep_alive_timeout_s),
            (bounds.BODY_TIMEOUT, self.body_timeout_s),
            (bounds.MAX_HEADER_BYTES, self.max_header_bytes),
            (bounds.MAX_CONNECTIONS, self.max_connections),
        ]

    def problems(self) -> list[str]:
        return bounds.problems(self.valued())

    @property
    def tick_s(self) -> float:
        """How often the adapter should ask `expired`: a quarter of the shortest timeout, 50 ms to 1 s."""
        shortest = min(self.header_timeout_s, self.keep_alive_timeout_s, self.body_timeout_s)
        return min(1.0, max(0.05, shortest / 4))


class ConnectionPhase(enum.Enum):
    """Where an open connection is in its request cycle (the module's docstring gives each deadline)."""

    FRESH = "fresh"
    HEAD = "head"
    BODY = "body"
    BUSY = "busy"
    IDLE = "idle"


EVICTABLE = frozenset({ConnectionPhase.FRESH, ConnectionPhase.IDLE, ConnectionPhase.HEAD})


class Expiry(enum.Enum):
    CLOSE = "idle"  # a fresh or kept-alive connection with nothing in progress: close quietly
    HEAD_TIMEOUT = "head_timeout"  # 408: the request head did not arrive in time
    BODY_TIMEOUT = "body_timeout"  # 408: the request body did not arrive in time
    SEND_TIMEOUT = "send_timeout"  # the client stopped reading its response: abort


class ConnectionAdmission(NamedTuple, Generic[K]):
    """The verdict on a new connection at the cap (not the worker's admission of work, `domain/scheduling/admission.py`)."""

    admitted: bool
    evicted: K | None  # the connection that gave way (the adapter closes it), if any


@dataclass(slots=True)
class _Entry:
    phase: ConnectionPhase
    deadline: float
    stalled_since: float | None = None


class ConnectionTable(Generic[K]):
    """The open connections of one listener, keyed by whatever the adapter uses (its protocol objects)."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self._entries: dict[K, _Entry] = {}
        self._evictable: dict[K, None] = {}  # insertion order: the longest-idle first

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def phase(self, key: K) -> ConnectionPhase | None:
        entry = self._entries.get(key)
        return None if entry is None else entry.phase

    def count(self, phase: ConnectionPhase) -> int:
        """Open connections in PHASE."""
        return sum(1 for entry in self._entries.values() if entry.phase is phase)

    def evictable(self) -> list[K]:
        """Evictable connections, the longest-idle first."""
        return list(self._evictable)

    def open(self, key: K, now: float) -> ConnectionAdmission[K]:
        """A new connection: admitted (perhaps in the place of an evicted one) or refused."""
        evicted: K | None = None
        if len(self._entries) >= self.limits.max_connections:
            evicted = next(iter(self._evictable), None)
            if evicted is None:
                return ConnectionAdmission(False, None)
            self.close(evicted)
        self._entries[key] = _Entry(ConnectionPhase.FRESH, now + self.limits.header_timeout_s)
        self._evictable[key] = None
        return ConnectionAdmission(True, evicted)

    def head_started(self, key: K, now: float) -> None:
        """The first byte of a request head. A fresh connection keeps its deadline; a kept-alive
        one gets `header_timeout` from now; a busy one (a pipelined request) stays busy."""
        entry = self._entries.get(key)
        if entry is None or entry.phase not in (ConnectionPhase.FRESH, ConnectionPhase.IDLE):
            return
        if entry.phase is ConnectionPhase.IDLE:
            entry.deadline = now + self.limits.header_timeout_s
        entry.phase = ConnectionPhase.HEAD

    def head_done(self, key: K, now: float) -> None:
        entry = self._entries.get(key)
        if entry is None:
            return
        entry.phase = ConnectionPhase.BODY
        entry.deadline = now + self.limits.body_timeout_s
        self._evictable.pop(key, None)

    def body_done(self, key: K, now: float) -> None:
        self._busy(key)

    def held(self, key: K) -> None:
        """A request arrived that the server leaves unread for now (its tenant is paced,
        R-FAIR-5): the wait is the server's, so no deadline runs and it is not evicted."""
        self._busy(key)

    def _busy(self, key: K) -> None:
        entry = self._entries.get(key)
        if entry is None:
            return
        entry.phase = ConnectionPhase.BUSY
        entry.deadline = math.inf
        self._evictable.pop(key, None)

    def read_resumed(self, key: K, now: float) -> None:
        """A held request is read now: its head has `header_timeout` from now, as a kept-alive
        connection's would from its first byte."""
        entry = self._entries.get(key)
        if entry is None:
            return
        entry.phase = ConnectionPhase.HEAD
        entry.deadline = now + self.limits.header_timeout_s
        self._evictable[key] = None

    def answered(self, key: K, now: float) -> None:
        """The application answered and nothing else is in progress: kept alive, the most recently
        idle. Writes that stalled stay stalled: the answer may still sit unread in the buffer."""
        entry = self._entries.get(key)
        if entry is None:
            return
        entry.phase = ConnectionPhase.IDLE
        entry.deadline = now + self.limits.keep_alive_timeout_s
        self._evictable.pop(key, None)
        self._evictable[key] = None

    def write_paused(self, key: K, now: float) -> None:
        entry = self._entries.get(key)
        if entry is not None and entry.stalled_since is None:
            entry.stalled_since = now

    def write_resumed(self, key: K) -> None:
        entry = self._entries.get(key)
        if entry is not None:
            entry.stalled_since = None

    def close(self, key: K) -> None:
        self._entries.pop(key, None)
        self._evictable.pop(key, None)

    def expired(self, now: float) -> list[tuple[K, Expiry]]:
        """Connections past their deadline, with what to do; they leave the table."""
        out: list[tuple[K, Expiry]] = []
        stall_limit = self.limits.body_timeout_s
        for key, entry in self._entries.items():
            if now >= entry.deadline:
                out.append((key, _EXPIRY[entry.phase]))
            elif entry.stalled_since is not None and now - entry.stalled_since >= stall_limit:
                out.append((key, Expiry.SEND_TIMEOUT))
        for key, _ in out:
            self.close(key)
        return out


_EXPIRY = {
    ConnectionPhase.FRESH: Expiry.CLOSE,
    ConnectionPhase.IDLE: Expiry.CLOSE,
    ConnectionPhase.HEAD: Expiry.HEAD_TIMEOUT,
    ConnectionPhase.BODY: Expiry.BODY_TIMEOUT,
    ConnectionPhase.BUSY: Expiry.SEND_TIMEOUT,  # never reached: a busy connection's deadline is infinite
}
