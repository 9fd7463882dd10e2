"""Dispatch over one deployment's replicas (R-REP-3): least outstanding request bytes.

`Pool.pick` chooses where one request (a merged question batch, one unit) goes;
`Pool.release` must be called exactly once per successful pick, whatever happened to the
request, and always gives back its in-flight slot and bytes. There is no pool-level queue.

Which replicas may take a request, best tier first (a tier is used only when every better
tier is empty):
1. up (ready, compatible, not failed), not full, not backing off, not ejected;
2. up, not full, backing off, not ejected — a backoff is a short hint, so when nothing
   else can take the request the pool would rather try than refuse;
3. up, not full, ejected — "if no other replica can take requests, ejected replicas serve
   again" (R-REP-5); an ejected replica in backoff is also in this tier.
A full replica (in-flight at the cap) can never take a request. Within a tier: the fewest
outstanding bytes, ties to the least recently assigned (one pool-wide sequence), then the
declared order. No tier has anyone: `Overloaded` when some up replica exists (all are full),
else `NotReady`; both carry `retry_after_s`.

`exclude` leaves replicas out of one pick: a request that never reached its replica (the
connection could not be opened) is offered to the others, each at most once.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator

from vllm_srun.domain.errors import NotReady, Overloaded
from vllm_srun.domain.fleet.ejection import EjectionPolicy, OutlierDetection, PoolEvent
from vllm_srun.domain.fleet.replicas import Outcome, Replica, ReplicaId, ReplicaStatus

DEFAULT_MAX_IN_FLIGHT = 32
RETRY_AFTER_OVERLOADED_S = 1
RETRY_AFTER_STARTING_S = 5
RETRY_AFTER_UNAVAILABLE_S = 10


class Pool:
    """The replicas of one logical deployment, their load and their outlier state."""

    def __init__(
        self,
        replicas: Iterable[ReplicaId | Replica] = (),
        *,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        outlier_detection: OutlierDetection | None = None,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")
        self.max_in_flight = max_in_flight
        self.policy = EjectionPolicy(outlier_detection)
        self._replicas: dict[ReplicaId, Replica] = {}
        self._assignments = 0
        for replica in replicas:
            self.add(replica)

    # ---- membership ----------------------------------------------------------------------
    def add(self, replica: ReplicaId | Replica) -> Replica:
        record = replica if isinstance(replica, Replica) else Replica(replica)
        if record.id in self._replicas:
            raise ValueError(f"replica {record.id!r} is already in the pool")
        self._replicas[record.id] = record
        return record

    def remove(self, replica_id: ReplicaId) -> Replica:
        """Retire a replica: it takes no new requests; releases for it become no-ops."""
        return self._replicas.pop(replica_id)

    def __getitem__(self, replica_id: ReplicaId) -> Replica:
        return self._replicas[replica_id]

    def __iter__(self) -> Iterator[Replica]:
        return iter(list(self._replicas.values()))

    def __len__(self) -> int:
        return len(self._replicas)

    def is_full(self, replica: Replica) -> bool:
        return replica.in_flight >= self.max_in_flight

    def ready_count(self) -> int:
        return sum(1 for replica in self._replicas.values() if replica.up)

    def inventory(self, now: float) -> list[ReplicaStatus]:
        return [replica.status(now) for replica in self._replicas.values()]

    # ---- dispatch ------------------------------------------------------------------------
    def dispatch_tier(self, replica: Replica, now: float) -> int | None:
        """1, 2 or 3 (see the module docstring), or None when it cannot take a request."""
        if not replica.up or self.is_full(replica):
            return None
        if replica.is_ejected(now):
            return 3
        if replica.in_backoff(now):
            return 2
        return 1

    def pick(self, request_bytes: int, now: float, *, exclude: Collection[ReplicaId] = ()) -> ReplicaId:
        """Choose a replica for one request and charge it one in-flight slot and its bytes;
        replicas in `exclude` are not considered (nor counted in the refusal)."""
        if request_bytes < 0:
            raise ValueError("request_bytes must be >= 0")
        best: Replica | None = None
        best_key: tuple[int, int, int] | None = None
        candidates = [r for r in self._replicas.values() if r.id not in exclude] if exclude else self._replicas.values()
        for replica in candidates:
            tier = self.dispatch_tier(replica, now)
            if tier is None:
                continue
            key = (tier, replica.outstanding_bytes, replica.last_assigned)
            if best_key is None or key < best_key:
                best, best_key = replica, key
        if best is None:
            raise self._refusal(candidates)
        self._assignments += 1
        best.last_assigned = self._assignments
        best.in_flight += 1
        best.outstanding_bytes += request_bytes
        return best.id

    def release(
        self,
        replica_id: ReplicaId,
        outcome: Outcome,
        now: float,
        *,
        request_bytes: int,
        started_at: float | None = None,
    ) -> list[PoolEvent]:
        """Give back one request's slot and bytes and feed its outcome to the outlier policy.

        `request_bytes` is what `pick` was given; `started_at` is when the request was sent
        (it dates the start of a timeout streak, see `ejection.py`). A replica that has left the
        pool is ignored (its requests no longer count anywhere).
        """
        replica = self._replicas.get(replica_id)
        if replica is None:
            return []
        if replica.in_flight < 1 or replica.outstanding_bytes < request_bytes:
            raise ValueError(
                f"release of {request_bytes} bytes on {replica_id!r} that holds "
                f"{replica.in_flight} requests and {replica.outstanding_bytes} bytes"
            )
        replica.in_flight -= 1
        replica.outstanding_bytes -= request_bytes
        replicas = list(self._replicas.values())
        return self.policy.observe(replica, Outcome(outcome), now, replicas, started_at=started_at)

    def tick(self, now: float) -> list[PoolEvent]:
        """Readmit replicas whose ejection cooldown ran out; call it now and then for logs."""
        return self.policy.expire(list(self._replicas.values()), now)

    def _refusal(self, candidates: Iterable[Replica]) -> Overloaded | NotReady:
        listed = list(candidates)
        seconds = retry_after_seconds(listed, self.max_in_flight)
        if any(replica.up for replica in listed):
            return Overloaded(f"every ready replica has {self.max_in_flight} requests in flight", seconds)
        return NotReady("no replica of this deployment is ready", seconds)


def retry_after_seconds(replicas: Iterable[Replica], max_in_flight: int) -> int:
    """A Retry-After suggestion, in whole seconds, for a refused request.

    Full replicas free a slot within a request's time, so 1 s; a replica that is starting
    (or restarting) needs a few seconds; with nothing starting, a longer wait.
    """
    listed = list(replicas)
    if any(replica.up and replica.in_flight >= max_in_flight for replica in listed):
        return RETRY_AFTER_OVERLOADED_S
    if any(replica.incompatible_reason is None and not replica.up for replica in listed):
        return RETRY_AFTER_STARTING_S
    return RETRY_AFTER_UNAVAILABLE_S
