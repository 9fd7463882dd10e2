"""Outlier ejection (R-REP-5): a pure policy over (replica, outcome, now) observations.

A worker whose forward is stuck may still answer /health, so the pool watches what its
requests do. The policy mutates the outlier fields of `Replica` records and returns events;
it never logs, reads a clock or sleeps. Adapters turn the events into logs
(`replica_ejected`, `replica_readmitted`, `replica_ejection_withheld`), metrics and /health
probes.

Rules, in the order they are applied:
- `ok` resets the timeout streak, the backoff and the ejection multiplier, and readmits an
  ejected replica at once.
- `cancelled` and `rejected` change nothing.
- `failed` backs the replica off (0.1 s doubling to 3.2 s) and asks for a /health probe;
  it neither counts as a timeout nor resets the streak.
- `timeout` counts, backs off and asks for a probe like a failure; at `consecutive_timeouts`
  the replica is ejected for `base_ejection_ms × 2^(ejections in a row)`, at most
  `max_ejection_ms`, unless a guard withholds it:
  one-worker deployment; no other ready, non-ejected replica answered since this one began
  timing out; or `max_ejection_percent` already ejected (one can always be).
- "Began timing out" is when the first timed-out request of the current streak was sent
  (`started_at`; the time the timeout was observed when the caller does not say), so with
  `consecutive_timeouts: 1` a replica is ejected when another one answered while its request
  was stuck.
- A replica that was ejected keeps its count, so its next timeout after the cooldown
  ejects it again (twice as long) without waiting for another full streak.
- Timeouts that land while the replica is already ejected count but do not extend it.
- Withheld decisions are re-examined at the replica's next timeout.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from vllm_srun.domain.fleet.replicas import NEVER, Outcome, Replica, ReplicaId

ONE_HOUR_MS = 3_600_000


@dataclass(frozen=True)
class OutlierDetection:
    """Resolved settings; `max_ejection_ms=None` means ten times the base, at most one hour."""

    consecutive_timeouts: int = 3  # 0 turns ejection off (backoff and probes stay on)
    base_ejection_ms: int = 30_000
    max_ejection_ms: int | None = None
    max_ejection_percent: int = 50
    backoff_initial_s: float = 0.1
    backoff_max_s: float = 3.2

    def __post_init__(self) -> None:
        if self.consecutive_timeouts < 0:
            raise ValueError("consecutive_timeouts must be >= 0")
        if not 1 <= self.base_ejection_ms <= ONE_HOUR_MS:
            raise ValueError("base_ejection_ms must be between 1 and 3600000")
        if self.max_ejection_ms is not None and not (self.base_ejection_ms <= self.max_ejection_ms <= ONE_HOUR_MS):
            raise ValueError("max_ejection_ms must be between base_ejection_ms and 3600000")
        if not 0 <= self.max_ejection_percent <= 100:
            raise ValueError("max_ejection_percent must be between 0 and 100")
        if not 0 < self.backoff_initial_s <= self.backoff_max_s:
            raise ValueError("backoff must satisfy 0 < backoff_initial_s <= backoff_max_s")

    @property
    def enabled(self) -> bool:
        return self.consecutive_timeouts > 0

    @property
    def effective_max_ejection_ms(self) -> int:
        if self.max_ejection_ms is not None:
            return self.max_ejection_ms
        return min(10 * self.base_ejection_ms, ONE_HOUR_MS)

    def ejection_seconds(self, ejections_in_a_row: int) -> float:
        """How long the next ejection lasts, given how many came right before it."""
        doublings = min(ejections_in_a_row, 32)  # 2^32 × 1 ms is far past the one-hour cap
        ms = min(self.base_ejection_ms << doublings, self.effective_max_ejection_ms)
        return ms / 1000.0

    def max_ejected(self, replica_count: int) -> int:
        """How many replicas may be ejected at once: never the only one, always one of two+."""
        if replica_count <= 1:
            return 0
        return max(1, replica_count * self.max_ejection_percent // 100)

    def next_backoff_seconds(self, previous_s: float) -> float:
        if previous_s <= 0:
            return self.backoff_initial_s
        return min(previous_s * 2, self.backoff_max_s)


# ---- events ------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReplicaBackedOff:
    replica: ReplicaId
    seconds: float
    until: float


@dataclass(frozen=True)
class ReplicaEjected:
    replica: ReplicaId
    seconds: float
    until: float
    ejections_in_a_row: int  # including this one


@dataclass(frozen=True)
class ReplicaReadmitted:
    replica: ReplicaId
    reason: str  # "success" | "cooldown"


@dataclass(frozen=True)
class EjectionWithheld:
    replica: ReplicaId
    reason: str  # one of the WITHHELD_* constants


@dataclass(frozen=True)
class ProbeHealth:
    replica: ReplicaId


PoolEvent = ReplicaBackedOff | ReplicaEjected | ReplicaReadmitted | EjectionWithheld | ProbeHealth

WITHHELD_SINGLE_REPLICA = "single_replica"
WITHHELD_NO_OTHER_ANSWERED = "no_other_replica_answered"
WITHHELD_MAX_PERCENT = "max_ejection_percent"


class EjectionPolicy:
    """Applies the R-REP-5 rules to one deployment's replicas."""

    def __init__(self, settings: OutlierDetection | None = None) -> None:
        self.settings = settings or OutlierDetection()

    def expire(self, replicas: Sequence[Replica], now: float) -> list[PoolEvent]:
        """Readmit replicas whose cooldown ran out (they keep their multiplier and count)."""
        events: list[PoolEvent] = []
        for replica in replicas:
            if replica.ejected_until is not None and now >= replica.ejected_until:
                replica.ejected_until = None
                events.append(ReplicaReadmitted(replica.id, "cooldown"))
        return events

    def observe(
        self,
        replica: Replica,
        outcome: Outcome,
        now: float,
        replicas: Sequence[Replica],
        *,
        started_at: float | None = None,
    ) -> list[PoolEvent]:
        """Record one finished request of `replica` (sent at `started_at`); `replicas` is the
        whole pool, `replica` included."""
        events = self.expire(replicas, now)
        if outcome is Outcome.OK:
            events.extend(self._succeeded(replica, now))
        elif outcome is Outcome.FAILED:
            replica.failures += 1
            events.append(self._back_off(replica, now))
            events.append(ProbeHealth(replica.id))
        elif outcome is Outcome.TIMEOUT:
            sent = now if started_at is None else min(started_at, now)
            events.extend(self._timed_out(replica, now, sent, replicas))
        return events

    # ---- rules ---------------------------------------------------------------------------
    def _succeeded(self, replica: Replica, now: float) -> list[PoolEvent]:
        events: list[PoolEvent] = []
        if replica.is_ejected(now):
            events.append(ReplicaReadmitted(replica.id, "success"))
        replica.last_answered_at = now
        replica.consecutive_timeouts = 0
        replica.timing_out_since = None
        replica.ejection_count = 0
        replica.ejected_until = None
        replica.backoff_s = 0.0
        replica.backoff_until = NEVER
        return events

    def _timed_out(self, replica: Replica, now: float, sent: float, replicas: Sequence[Replica]) -> list[PoolEvent]:
        replica.timeouts += 1
        replica.consecutive_timeouts += 1
        if replica.timing_out_since is None or sent < replica.timing_out_since:
            replica.timing_out_since = sent
        events: list[PoolEvent] = [self._back_off(replica, now)]
        due = (
            self.settings.enabled
            and replica.consecutive_timeouts >= self.settings.consecutive_timeouts
            and not replica.is_ejected(now)
        )
        if due:
            withheld = self.withheld_reason(replica, now, replicas)
            events.append(EjectionWithheld(replica.id, withheld) if withheld else self._eject(replica, now))
        events.append(ProbeHealth(replica.id))
        return events

    def withheld_reason(self, replica: Replica, now: float, replicas: Sequence[Replica]) -> str | None:
        """Why `replica` may not be ejected now, or None when it may."""
        if len(replicas) <= 1:
            return WITHHELD_SINGLE_REPLICA
        since = replica.timing_out_since if replica.timing_out_since is not None else now
        out_answered = any(
            other is not replica
            and other.up
            and not other.is_ejected(now)
            and other.last_answered_at is not None
            and other.last_answered_at > since
            for other in replicas
        )
        if not out_answered:
            return WITHHELD_NO_OTHER_ANSWERED
        ejected = sum(1 for other in replicas if other is not replica and other.is_ejected(now))
        if ejected >= self.settings.max_ejected(len(replicas)):
            return WITHHELD_MAX_PERCENT
        return None

    def _eject(self, replica: Replica, now: float) -> ReplicaEjected:
        seconds = self.settings.ejection_seconds(replica.ejection_count)
        replica.ejection_count += 1
        replica.ejections_total += 1
        replica.ejected_until = now + seconds
        return ReplicaEjected(replica.id, seconds, now + seconds, replica.ejection_count)

    def _back_off(self, replica: Replica, now: float) -> ReplicaBackedOff:
        seconds = self.settings.next_backoff_seconds(replica.backoff_s)
        replica.backoff_s = seconds
        replica.backoff_until = max(replica.backoff_until, now + seconds)
        return ReplicaBackedOff(replica.id, seconds, replica.backoff_until)
