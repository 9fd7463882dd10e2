"""Connection hygiene (`domain/security/connections.py`) against an independent model, under a fake clock.

Rules open connections, move them through their phases (head arriving, body arriving, with the
application, held unread while the tenant is paced and read again, answered and kept alive,
writes stalled), close them and move the clock. The model
re-derives from the policy's words when each connection is due and which one gives way at the
cap; invariants: never more than `max_connections` open; a new connection is refused only when
none is evictable, and otherwise takes the place of the longest-idle evictable one; every
connection expires exactly when its phase's timeout says, and not before.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from vllm_srun.domain.security.connections import ConnectionLimits, ConnectionPhase, ConnectionTable, Expiry


@dataclass
class Conn:
    phase: ConnectionPhase
    deadline: float
    idle_since: float  # when it last became evictable (its place in the eviction order)
    stalled_since: float | None = None


class ConnectionMachine(RuleBasedStateMachine):
    @initialize(
        cap=st.integers(1, 5),
        header=st.sampled_from([1.0, 2.5, 10.0]),
        keep_alive=st.sampled_from([0.5, 3.0, 30.0]),
        body=st.sampled_from([1.0, 4.0]),
    )
    def start(self, cap: int, header: float, keep_alive: float, body: float) -> None:
        self.limits = ConnectionLimits(
            header_timeout_s=header, keep_alive_timeout_s=keep_alive, body_timeout_s=body, max_connections=cap
        )
        self.table: ConnectionTable[int] = ConnectionTable(self.limits)
        self.model: dict[int, Conn] = {}
        self.now = 0.0
        self.next_key = 0
        self.order = 0.0  # a tie-breaker: keys that became idle at the same time keep their order

    # ---- helpers ---------------------------------------------------------------------------------
    def evictable_order(self) -> list[int]:
        idle = [
            (c.idle_since, k)
            for k, c in self.model.items()
            if c.phase in (ConnectionPhase.FRESH, ConnectionPhase.IDLE, ConnectionPhase.HEAD)
        ]
        return [k for _, k in sorted(idle)]

    def stamp(self) -> float:
        self.order += 1e-9
        return self.now + self.order

    # ---- rules -----------------------------------------------------------------------------------
    @rule()
    def open(self) -> None:
        key = self.next_key
        self.next_key += 1
        admission = self.table.open(key, self.now)
        candidates = self.evictable_order()
        if len(self.model) < self.limits.max_connections:
            assert admission == (True, None)
        elif candidates:
            assert admission == (True, candidates[0])  # the longest-idle gives way
            del self.model[candidates[0]]
        else:
            assert admission == (False, None)  # every connection has a request in progress
            return
        self.model[key] = Conn(ConnectionPhase.FRESH, self.now + self.limits.header_timeout_s, self.stamp())

    def pick(self, data: st.DataObject) -> int:
        return data.draw(st.sampled_from(sorted(self.model)))

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def head_starts(self, data: st.DataObject) -> None:
        key = self.pick(data)
        self.table.head_started(key, self.now)
        conn = self.model[key]
        if conn.phase is ConnectionPhase.IDLE:
            conn.deadline = self.now + self.limits.header_timeout_s
        if conn.phase in (ConnectionPhase.FRESH, ConnectionPhase.IDLE):
            conn.phase = ConnectionPhase.HEAD

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def head_arrives(self, data: st.DataObject) -> None:
        key = self.pick(data)
        self.table.head_done(key, self.now)
        self.model[key].phase = ConnectionPhase.BODY
        self.model[key].deadline = self.now + self.limits.body_timeout_s

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def body_arrives(self, data: st.DataObject) -> None:
        key = self.pick(data)
        self.table.body_done(key, self.now)
        self.model[key].phase = ConnectionPhase.BUSY
        self.model[key].deadline = math.inf

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def held_unread(self, data: st.DataObject) -> None:
        """A paced tenant's request arrived and waits unread (R-FAIR-5): no deadline, not evictable."""
        key = self.pick(data)
        self.table.held(key)
        self.model[key].phase = ConnectionPhase.BUSY
        self.model[key].deadline = math.inf

    @precondition(lambda self: any(c.phase is ConnectionPhase.BUSY for c in self.model.values()))
    @rule(data=st.data())
    def held_read(self, data: st.DataObject) -> None:
        """A held request is read: a head again, `header_timeout` from now, evictable (the most recent)."""
        key = data.draw(st.sampled_from(sorted(k for k, c in self.model.items() if c.phase is ConnectionPhase.BUSY)))
        self.table.read_resumed(key, self.now)
        conn = self.model[key]
        conn.phase, conn.deadline, conn.idle_since = (
            ConnectionPhase.HEAD,
            self.now + self.limits.header_timeout_s,
            self.stamp(),
        )

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def answered(self, data: st.DataObject) -> None:
        key = self.pick(data)
        self.table.answered(key, self.now)
        stalled = self.model[key].stalled_since  # an unread answer stays stalled
        self.model[key] = Conn(ConnectionPhase.IDLE, self.now + self.limits.keep_alive_timeout_s, self.stamp(), stalled)

    @precondition(lambda self: self.model)
    @rule(data=st.data(), paused=st.booleans())
    def writes(self, data: st.DataObject, paused: bool) -> None:
        key = self.pick(data)
        conn = self.model[key]
        if paused:
            self.table.write_paused(key, self.now)
            if conn.stalled_since is None:
                conn.stalled_since = self.now
        else:
            self.table.write_resumed(key)
            conn.stalled_since = None

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def client_closes(self, data: st.DataObject) -> None:
        key = self.pick(data)
        self.table.close(key)
        del self.model[key]

    @rule(dt=st.sampled_from([0.0, 0.1, 0.5, 1.0, 2.0, 5.0, 40.0]))
    def time_passes(self, dt: float) -> None:
        self.now += dt
        expected = {}
        for key, conn in self.model.items():
            if self.now >= conn.deadline:
                expected[key] = {
                    ConnectionPhase.FRESH: Expiry.CLOSE,
                    ConnectionPhase.IDLE: Expiry.CLOSE,
                    ConnectionPhase.HEAD: Expiry.HEAD_TIMEOUT,
                    ConnectionPhase.BODY: Expiry.BODY_TIMEOUT,
                }[conn.phase]
            elif conn.stalled_since is not None and self.now - conn.stalled_since >= self.limits.body_timeout_s:
                expected[key] = Expiry.SEND_TIMEOUT
        assert dict(self.table.expired(self.now)) == expected
        for key in expected:
            del self.model[key]

    # ---- invariants --------------------------------------------------------------------------
    @invariant()
    def agrees_with_the_model(self) -> None:
        if not hasattr(self, "table"):
            return
        assert len(self.table) == len(self.model) <= self.limits.max_connections
        assert {k: self.table.phase(k) for k in self.model} == {k: c.phase for k, c in self.model.items()}
        assert self.table.evictable() == self.evictable_order()
        for phase in ConnectionPhase:
            assert self.table.count(phase) == sum(1 for c in self.model.values() if c.phase is phase)


TestConnections = ConnectionMachine.TestCase
TestConnections.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, suppress_health_check=list(HealthCheck)
)
