"""R-FAIR-7: the express forward, against a FakeForward and a FakeClock.

Rules submit requests for three tenants of different weights, flood one, hand out forwards to
the slots (`next_forward`) and the express forward (`next_express`), and finish running ones in
any order. Checked after every step:
- at most `max_in_flight` slot forwards and one express forward run at once; a slot that ends
  while the express forward runs is free again (the express forward takes none);
- an express forward is handed out only while every slot is taken and several tenants have rows
  queued, and it holds rows of a tenant asking least (queued counted tokens ÷ weight);
- a row is in one forward only, and every request is answered once, its outputs in its rows'
  order, cancelled ones never.
"""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tests.fakes import FakeClock, FakeForward
from vllm_srun.domain.fairness import row_cost
from vllm_srun.domain.lanes import Accounting, Lane
from vllm_srun.domain.planning import Budget, ForwardBatch
from vllm_srun.domain.rows import RowSpec
from vllm_srun.domain.scheduler import Scheduler
from vllm_srun.domain.tenants import TenantPolicy, TenantTable

TENANTS = ("a", "b", "c")


class ExpressMachine(RuleBasedStateMachine):
    @initialize(
        weights=st.tuples(*(st.sampled_from([1.0, 2.0, 3.0]) for _ in TENANTS)),
        slots=st.integers(1, 3),
        max_tokens=st.sampled_from([256, 1024]),
    )
    def start(self, weights: tuple[float, ...], slots: int, max_tokens: int) -> None:
        self.clock = FakeClock()
        self.engine = FakeForward()
        self.table = TenantTable({t: TenantPolicy(weight=w) for t, w in zip(TENANTS, weights)})
        self.scheduler = Scheduler(
            [Lane("text", Accounting.PACKED)],
            Budget(64, max_tokens),
            window_s=0.0,
            tenants=self.table,
            max_in_flight=slots,
        )
        self.slots: list[ForwardBatch] = []
        self.express: ForwardBatch | None = None
        self.sent: dict[int, int] = {}  # request id → rows
        self.numbers: dict[int, int] = {}
        self.cancelled: set[int] = set()
        self.answered: dict[int, tuple] = {}
        self.seen: set[tuple[int, int]] = set()

    def _submit(self, tenant: str, lengths: list[int]) -> None:
        number = len(self.numbers)
        rid = self.scheduler.submit(
            [RowSpec(n, (number, i)) for i, n in enumerate(lengths)], self.clock.now(), tenant=tenant
        )
        self.sent[rid], self.numbers[rid] = len(lengths), number

    @rule(tenant=st.sampled_from(TENANTS), lengths=st.lists(st.integers(1, 64), min_size=1, max_size=4))
    def submit(self, tenant: str, lengths: list[int]) -> None:
        self._submit(tenant, lengths)

    @rule(tenant=st.sampled_from(TENANTS), requests=st.integers(20, 200), seed=st.integers(0, 2**16))
    def flood(self, tenant: str, requests: int, seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(requests):
            self._submit(tenant, [rng.randint(1, 64) for _ in range(rng.randint(1, 4))])

    @precondition(lambda self: self._open())
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self._open())))
        assert self.scheduler.cancel(rid)
        self.cancelled.add(rid)

    @rule()
    def start_slot(self) -> None:
        full = len(self.slots) >= self.scheduler.max_in_flight
        batch = self.scheduler.next_forward(self.clock.now())
        if batch is None:
            return
        assert not full, "a slot forward handed out while every slot was taken"
        self._take(batch)
        self.slots.append(batch)

    @rule()
    def start_express(self) -> None:
        queued = self.scheduler.unplanned_rows
        full = len(self.slots) >= self.scheduler.max_in_flight
        asked: Counter[str] = Counter()
        for row in queued:
            asked[row.tenant] += row_cost(row)
        batch = self.scheduler.next_express()
        if batch is None:
            return
        assert self.express is None, "two express forwards at once"
        assert full, "an express forward while a slot was free"
        assert len(asked) >= 2, "an express forward with one tenant queued"
        least = min(asked[t] / self.table.weight(t) for t in asked)
        light = {t for t in asked if asked[t] / self.table.weight(t) == least}
        assert light & {r.tenant for r in batch.rows}, f"the express forward holds none of {sorted(light)}"
        self._take(batch)
        self.express = batch

    @precondition(lambda self: self.slots or self.express is not None)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        running = [*self.slots, *([self.express] if self.express is not None else [])]
        batch = running[data.draw(st.integers(0, len(running) - 1))]
        if batch is self.express:
            self.express = None
        else:
            self.slots.remove(batch)
        self._complete(batch)

    def _take(self, batch: ForwardBatch) -> None:
        for row in batch.rows:
            key = (row.request_id, row.index)
            assert key not in self.seen, "a row in two forwards"
            assert row.request_id not in self.cancelled, "a cancelled row reached a forward"
            self.seen.add(key)

    def _complete(self, batch: ForwardBatch) -> None:
        for answer in self.scheduler.complete(batch, self.engine.run(batch.lane, [r.payload for r in batch.rows])):
            assert answer.request_id not in self.answered, "answered twice"
            assert answer.request_id not in self.cancelled
            number = self.numbers[answer.request_id]
            assert answer.outputs == tuple((number, i) for i in range(self.sent[answer.request_id]))
            self.answered[answer.request_id] = answer.outputs

    def _open(self) -> set[int]:
        return set(self.sent) - set(self.answered) - self.cancelled

    @invariant()
    def in_flight_is_the_slots_and_the_express_forward(self) -> None:
        running = len(self.slots) + (self.express is not None)
        assert self.scheduler.in_flight == running
        assert len(self.slots) <= self.scheduler.max_in_flight
        assert self.scheduler.busy == (len(self.slots) >= self.scheduler.max_in_flight)

    def teardown(self) -> None:
        for batch in [*self.slots, *([self.express] if self.express is not None else [])]:
            self._complete(batch)
        while (batch := self.scheduler.next_forward(self.clock.now())) is not None:
            self._take(batch)
            self._complete(batch)
        assert not self._open(), "a request was never answered"


TestExpress = ExpressMachine.TestCase
TestExpress.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


def test_the_machine_hands_out_express_forwards() -> None:
    """The properties above are not vacuous: a flood on every slot, then a light request, gets one."""
    machine = ExpressMachine()
    machine.start(weights=(1.0, 1.0, 1.0), slots=2, max_tokens=256)
    machine.flood("a", requests=100, seed=1)
    machine.start_slot()
    machine.start_slot()
    machine.submit("b", [8])
    machine.start_express()
    assert machine.express is not None and "b" in {r.tenant for r in machine.express.rows}
    machine.in_flight_is_the_slots_and_the_express_forward()
    machine.teardown()
