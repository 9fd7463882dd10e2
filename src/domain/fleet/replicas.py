"""Replica membership and state: one record per worker of a logical deployment (R-REP-4).

A `Replica` is plain bookkeeping. Who decides what happens to it lives elsewhere: the pool
(`dispatch.py`) moves load counters, the outlier policy (`ejection.py`) moves the timeout,
backoff and ejection fields, and the workers adapter reports lifecycle changes through the
`mark_*` methods. The state shown in the inventory is derived from the record and `now`, so
a cooldown that ran out needs no timer to take effect.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

ReplicaId = str

NEVER = -math.inf
"""`backoff_until` of a replica that is not backing off."""


class ReplicaState(StrEnum):
    STARTING = "starting"
    READY = "ready"
    BACKOFF = "backoff"
    EJECTED = "ejected"
    INCOMPATIBLE = "incompatible"
    FAILED = "failed"


class Outcome(StrEnum):
    """How one dispatched request ended, as far as the pool is concerned."""

    OK = "ok"  # the replica answered (any answer the worker meant to give, 4xx included)
    FAILED = "failed"  # the replica failed: 5xx, connection reset, process died
    REJECTED = "rejected"  # the replica turned the request away (429/503 from the worker)
    CANCELLED = "cancelled"  # the client went away before the answer
    TIMEOUT = "timeout"  # the request passed its deadline or the deployment's timeout_ms


@dataclass
class Replica:
    """One worker of a deployment. Mutable; owned by exactly one pool."""

    id: ReplicaId
    # lifecycle, reported by the workers adapter
    ready: bool = False
    failed_reason: str | None = None
    incompatible_reason: str | None = None
    restarts: int = 0
    # load, moved by the pool
    in_flight: int = 0
    outstanding_bytes: int = 0
    last_assigned: int = 0  # pool assignment sequence number; 0 = never assigned
    # outlier bookkeeping, moved by the ejection policy
    consecutive_timeouts: int = 0
    timing_out_since: float | None = None  # when this streak's first timed-out request was sent
    last_answered_at: float | None = None  # when its latest successful answer arrived
    timeouts: int = 0  # totals, for inventory and metrics
    failures: int = 0
    backoff_s: float = 0.0  # length of the latest backoff; 0 = none since the last success
    backoff_until: float = NEVER
    ejected_until: float | None = None
    ejection_count: int = 0  # ejections in a row; a success resets it
    ejections_total: int = 0

    # ---- derived state -------------------------------------------------------------------
    @property
    def up(self) -> bool:
        """Ready, compatible and not failed: allowed to serve at all."""
        return self.ready and self.failed_reason is None and self.incompatible_reason is None

    def is_ejected(self, now: float) -> bool:
        return self.ejected_until is not None and now < self.ejected_until

    def in_backoff(self, now: float) -> bool:
        return now < self.backoff_until

    def state(self, now: float) -> ReplicaState:
        if self.failed_reason is not None:
            return ReplicaState.FAILED
        if self.incompatible_reason is not None:
            return ReplicaState.INCOMPATIBLE
        if not self.ready:
            return ReplicaState.STARTING
        if self.is_ejected(now):
            return ReplicaState.EJECTED
        if self.in_backoff(now):
            return ReplicaState.BACKOFF
        return ReplicaState.READY

    def status(self, now: float) -> ReplicaStatus:
        return ReplicaStatus(
            id=self.id,
            state=self.state(now),
            ready=self.up,
            in_flight=self.in_flight,
            outstanding_bytes=self.outstanding_bytes,
            restarts=self.restarts,
            consecutive_timeouts=self.consecutive_timeouts,
            ejections=self.ejections_total,
            ejected_for_s=max(0.0, self.ejected_until - now)
            if self.ejected_until is not None and self.is_ejected(now)
            else 0.0,
            reason=self.failed_reason or self.incompatible_reason,
        )

    # ---- lifecycle, reported by the workers adapter ------------------------------------
    def mark_ready(self) -> None:
        self.ready = True
        self.failed_reason = None

    def mark_failed(self, reason: str) -> None:
        """The process died or stopped answering /health."""
        self.ready = False
        self.failed_reason = reason

    def mark_incompatible(self, reason: str) -> None:
        """Its card disagrees with the deployment (R-REP-2); it is never dispatched to."""
        self.incompatible_reason = reason

    def mark_compatible(self) -> None:
        self.incompatible_reason = None

    def mark_restarted(self) -> None:
        """A fresh process replaced it: starting again, with a clean outlier record.

        In-flight counters are left alone: requests still held by the old process are released
        by their callers (as `failed`), which brings the counters back to zero.
        """
        self.restarts += 1
        self.ready = False
        self.failed_reason = None
        self.incompatible_reason = None
        self.consecutive_timeouts = 0
        self.timing_out_since = None
        self.backoff_s = 0.0
        self.backoff_until = NEVER
        self.ejected_until = None
        self.ejection_count = 0


@dataclass(frozen=True)
class ReplicaStatus:
    """One inventory row (R-REP-4), detached from the live record."""

    id: ReplicaId
    state: ReplicaState
    ready: bool
    in_flight: int
    outstanding_bytes: int
    restarts: int
    consecutive_timeouts: int
    ejections: int
    ejected_for_s: float
    reason: str | None
