"""R-REP-3 dispatch against a simple model: least outstanding bytes, least recently assigned,
the in-flight cap, the fallback tiers for backoff/ejected replicas, 429 vs 503, and load
accounting that always returns to zero."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from tests.fakes import FakeClock
from vllm_srun.domain.errors import NotReady, Overloaded
from vllm_srun.domain.fleet.dispatch import Pool, retry_after_seconds
from vllm_srun.domain.fleet.ejection import OutlierDetection, ReplicaEjected
from vllm_srun.domain.fleet.replicas import Outcome, Replica, ReplicaState


class DispatchMachine(RuleBasedStateMachine):
    @initialize(
        count=st.sampled_from([1, 2, 2, 3, 5]),
        cap=st.integers(1, 4),
        threshold=st.integers(0, 2),
    )
    def start(self, count: int, cap: int, threshold: int) -> None:
        self.clock = FakeClock()
        self.cap = cap
        self.ids = [f"r{i}" for i in range(count)]
        self.pool = Pool(
            self.ids,
            max_in_flight=cap,
            outlier_detection=OutlierDetection(
                consecutive_timeouts=threshold, base_ejection_ms=300, max_ejection_ms=1200
            ),
        )
        for replica in self.pool:
            replica.mark_ready()
        self.held: list[tuple[str, int, float]] = []  # replica, bytes, sent at
        self.assigned_at: dict[str, int] = dict.fromkeys(self.ids, 0)  # model's own LRU
        self.picks = 0
        self.ejections = 0

    # ---- the model of which replica should be picked ------------------------------------
    def _tier(self, replica: Replica) -> int | None:
        now = self.clock.now()
        usable = (
            replica.ready
            and replica.failed_reason is None
            and replica.incompatible_reason is None
            and replica.in_flight < self.cap
        )
        if not usable:
            return None
        ejected = replica.ejected_until is not None and replica.ejected_until > now
        backing_off = replica.backoff_until > now
        return 3 if ejected else 2 if backing_off else 1

    @rule(size=st.integers(0, 5_000), data=st.data())
    def pick(self, size: int, data: st.DataObject) -> None:
        """A pick, now and then with some replicas excluded (a retry after a failed connect)."""
        now = self.clock.now()
        exclude = data.draw(st.frozensets(st.sampled_from(self.ids), max_size=len(self.ids)) | st.just(frozenset()))
        considered = [r for r in self.pool if r.id not in exclude]
        ranked = sorted(
            (tier, r.outstanding_bytes, self.assigned_at[r.id], self.ids.index(r.id), r.id)
            for r in considered
            if (tier := self._tier(r)) is not None
        )
        any_up = any(r.up for r in considered)
        try:
            chosen = self.pool.pick(size, now, exclude=exclude)
        except Overloaded as error:
            assert not ranked and any_up
            assert all(r.in_flight >= self.cap for r in considered if r.up)
            assert error.retry_after_s >= 1
            return
        except NotReady as error:
            assert not ranked and not any_up
            assert error.retry_after_s >= 1
            return
        assert ranked, "picked although nothing could take the request"
        assert chosen == ranked[0][-1] and chosen not in exclude
        chosen_tier = ranked[0][0]
        # never a full replica, never a worse tier while a better one can take it
        assert self.pool[chosen].in_flight <= self.cap
        if chosen_tier > 1:
            state = self.pool[chosen].state(now)
            assert state in (ReplicaState.BACKOFF, ReplicaState.EJECTED)
        self.picks += 1
        self.assigned_at[chosen] = self.picks
        self.held.append((chosen, size, now))

    @precondition(lambda self: self.held)
    @rule(data=st.data(), outcome=st.sampled_from(list(Outcome)))
    def release(self, data: st.DataObject, outcome: Outcome) -> None:
        index = data.draw(st.integers(0, len(self.held) - 1))
        replica_id, size, sent = self.held.pop(index)
        now = self.clock.now()
        events = self.pool.release(replica_id, outcome, now, request_bytes=size, started_at=sent)
        self.ejections += sum(isinstance(event, ReplicaEjected) for event in events)

    @rule(
        index=st.integers(0, 4),
        suspicion=st.sampled_from(["backoff", "ejected", "both"]),
        seconds=st.sampled_from([0.1, 1.0, 5.0]),
    )
    def suspect(self, index: int, suspicion: str, seconds: float) -> None:
        """Put a replica in backoff or ejection directly, as the outlier policy would."""
        replica = self.pool[self.ids[index % len(self.ids)]]
        until = self.clock.now() + seconds
        if suspicion in ("backoff", "both"):
            replica.backoff_until = until
        if suspicion in ("ejected", "both"):
            replica.ejected_until = until

    @rule(seconds=st.sampled_from([0.0, 0.05, 0.1, 0.4, 1.0, 4.0]))
    def wait(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule(
        index=st.integers(0, 4),
        change=st.sampled_from(["ready", "fail", "incompatible", "compatible", "restart"]),
    )
    def lifecycle(self, index: int, change: str) -> None:
        replica = self.pool[self.ids[index % len(self.ids)]]
        if change == "ready":
            replica.mark_ready()
        elif change == "fail":
            replica.mark_failed("health probe failed")
        elif change == "incompatible":
            replica.mark_incompatible("max_num_seqs 64 differs from the set 256")
        elif change == "compatible":
            replica.mark_compatible()
        else:
            replica.mark_restarted()

    @invariant()
    def load_matches_what_is_held(self) -> None:
        if not hasattr(self, "pool"):
            return
        counts = Counter(replica_id for replica_id, _, _ in self.held)
        sizes: Counter[str] = Counter()
        for replica_id, size, _ in self.held:
            sizes[replica_id] += size
        for replica in self.pool:
            assert replica.in_flight == counts[replica.id]
            assert replica.outstanding_bytes == sizes[replica.id]
            assert 0 <= replica.in_flight <= self.cap

    def teardown(self) -> None:
        if not hasattr(self, "pool"):
            return
        for replica_id, size, _ in self.held:
            self.pool.release(replica_id, Outcome.CANCELLED, self.clock.now(), request_bytes=size)
        self.held.clear()
        assert all(r.in_flight == 0 and r.outstanding_bytes == 0 for r in self.pool)


DispatchMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestDispatch = DispatchMachine.TestCase


# ---- worked examples --------------------------------------------------------------------
def _ready_pool(count: int, **kwargs: object) -> Pool:
    pool = Pool([f"r{i}" for i in range(count)], **kwargs)  # type: ignore[arg-type]
    for replica in pool:
        replica.mark_ready()
    return pool


def test_fewest_outstanding_bytes_wins_and_ties_go_to_least_recently_assigned() -> None:
    pool = _ready_pool(3)
    assert [pool.pick(100, 0.0) for _ in range(3)] == ["r0", "r1", "r2"]  # ties: LRU order
    pool.release("r1", Outcome.OK, 0.0, request_bytes=100)
    assert pool.pick(10, 0.0) == "r1"  # 0 bytes outstanding
    assert pool.pick(10, 0.0) == "r1"  # 10 < 100
    pool.release("r0", Outcome.OK, 0.0, request_bytes=100)
    pool.release("r2", Outcome.OK, 0.0, request_bytes=100)
    assert pool.pick(5, 0.0) == "r0"  # r0 and r2 both at 0; r0 was assigned longer ago


def test_full_pool_is_overloaded_and_unready_pool_is_not_ready() -> None:
    pool = _ready_pool(2, max_in_flight=2)
    for _ in range(4):
        pool.pick(1, 0.0)
    with pytest.raises(Overloaded) as overloaded:
        pool.pick(1, 0.0)
    assert overloaded.value.code == "overloaded" and overloaded.value.retry_after_s == 1
    starting = Pool(["a", "b"])
    with pytest.raises(NotReady) as not_ready:
        starting.pick(1, 0.0)
    assert not_ready.value.code == "not_ready" and not_ready.value.retry_after_s == 5
    assert retry_after_seconds([], 32) == 10


def test_backoff_and_ejected_replicas_serve_only_when_nobody_else_can() -> None:
    pool = _ready_pool(2, outlier_detection=OutlierDetection(consecutive_timeouts=1))
    assert [pool.pick(1, 0.0), pool.pick(1, 0.0)] == ["r0", "r1"]
    pool.release("r0", Outcome.OK, 0.5, request_bytes=1)  # r0 answers while r1 is stuck
    events = pool.release("r1", Outcome.TIMEOUT, 1.0, request_bytes=1, started_at=0.0)
    assert any(isinstance(event, ReplicaEjected) for event in events)
    assert [pool.pick(1, 1.0) for _ in range(3)] == ["r0", "r0", "r0"]
    pool["r0"].mark_failed("connection refused")
    assert pool.pick(1, 1.0) == "r1"  # the ejected replica serves again
    rows = {row.id: row for row in pool.inventory(1.0)}
    assert rows["r0"].state is ReplicaState.FAILED and rows["r0"].reason == "connection refused"
    assert rows["r1"].state is ReplicaState.EJECTED and rows["r1"].ejected_for_s == 30.0
    assert (rows["r1"].in_flight, rows["r1"].outstanding_bytes, rows["r1"].ejections) == (1, 1, 1)
    pool["r0"].mark_restarted()
    assert pool["r0"].state(1.0) is ReplicaState.STARTING and pool["r0"].restarts == 1


def test_release_of_a_retired_replica_is_ignored_and_over_release_is_refused() -> None:
    pool = _ready_pool(2)
    replica_id = pool.pick(10, 0.0)
    pool.remove(replica_id)
    assert pool.release(replica_id, Outcome.OK, 0.0, request_bytes=10) == []
    other = pool.pick(10, 0.0)
    with pytest.raises(ValueError):
        pool.release(other, Outcome.OK, 0.0, request_bytes=11)
