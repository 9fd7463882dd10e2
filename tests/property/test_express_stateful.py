"""R-FAIR-7: the express forward, against a FakeForward and a FakeClock.

Rules submit requests for three tenants of different weights, flood one, hand out forwards to
the slots (`next_forward`) and the express forward (`next_express`), and finish running ones in
any order. Checked after every step:
- at most `max_in_flight` slot forwards and one express forward run at once; a slot that ends
  while the express forward runs is free again (the express forward takes none);
- an express forward is handed out only while every slot is taken and a tenant with rows queued
  asks least (queued and running counted tokens ÷ weight) while another asks more; it holds rows
  of the tenants asking least only, of those that had not had their next turn early already
  (`FairQueue.take_ahead`);
- a row is in one forward only, and every request is answered once, its outputs in its rows'
  order, cancelled ones never.
"""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tests.fakes import FakeClock, FakeForward
from vllm_srun.domain.scheduling.fairness import row_cost
from vllm_srun.domain.scheduling.lanes import Accounting, Lane, round_up
from vllm_srun.domain.scheduling.planning import Budget, ForwardBatch
from vllm_srun.domain.scheduling.rows import RowSpec
from vllm_srun.domain.scheduling.scheduler import Scheduler
from vllm_srun.domain.scheduling.tenants import TenantPolicy, TenantTable

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
        queued = {row.tenant for row in self.scheduler.unplanned_rows}
        full = len(self.slots) >= self.scheduler.max_in_flight
        asked: Counter[str] = Counter()
        for row in [*self.scheduler.unplanned_rows, *(r for b in self.slots for r in b.rows)]:
            asked[row.tenant] += row_cost(row)
        ahead = {t for t in TENANTS if self.scheduler.turns_ahead(t)}
        batch = self.scheduler.next_express()
        if batch is None:
            return
        assert self.express is None, "two express forwards at once"
        assert full, "an express forward while a slot was free"
        weighed = {t: asked[t] / self.table.weight(t) for t in asked}
        least = min(weighed[t] for t in queued)
        assert max(weighed.values()) > least, "an express forward while nobody asked more"
        light = {t for t in queued if weighed[t] == least} - ahead
        tenants = {r.tenant for r in batch.rows}
        assert tenants and tenants <= light, f"the express forward of {sorted(light)} holds {sorted(tenants)}"
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


@settings(max_examples=25, deadline=None)
@given(
    weights=st.tuples(*(st.sampled_from([1.0, 2.0, 3.0]) for _ in TENANTS)),
    max_tokens=st.sampled_from([1024, 2048]),
    seed=st.integers(0, 2**16),
)
def test_floods_keep_their_weight_shares_beside_express_forwards(
    weights: tuple[float, ...], max_tokens: int, seed: int
) -> None:
    """R-FAIR-2 with R-FAIR-7: three tenants flood two slots (rows ≤ 64 tokens, each kept
    backlogged), the express forward runs whenever it may, and forwards end oldest first. Over any
    64 forwards (express ones counted) each tenant's share of the counted tokens is within 10 % of
    its weight's share: the turns had early change the order, not the shares."""
    rng = random.Random(seed)
    table = TenantTable({t: TenantPolicy(weight=w) for t, w in zip(TENANTS, weights)})
    scheduler = Scheduler(
        [Lane("text", Accounting.PACKED)], Budget(256, max_tokens), window_s=0.0, tenants=table, max_in_flight=2
    )
    queued = Counter(dict.fromkeys(TENANTS, 0))  # counted tokens each tenant has queued

    def flood(tenant: str) -> None:
        for _ in range(rng.randint(20, 80)):
            lengths = [rng.randint(1, 64) for _ in range(rng.randint(1, 4))]
            scheduler.submit([RowSpec(n, None) for n in lengths], 0.0, tenant=tenant)
            queued[tenant] += sum(round_up(n) for n in lengths)

    running: list[ForwardBatch] = []
    log: list[Counter[str]] = []  # each forward's counted tokens by tenant
    windows = expressed = 0
    for _ in range(300):
        for tenant in TENANTS:
            while queued[tenant] < 2 * max_tokens:  # every tenant stays backlogged
                flood(tenant)
        batches = []
        while (batch := scheduler.next_forward(0.0)) is not None:
            batches.append(batch)
        express = scheduler.next_express()
        expressed += express is not None
        for batch in [*batches, *([express] if express is not None else [])]:
            running.append(batch)
            log.append(Counter(dict.fromkeys(TENANTS, 0)))
            for row in batch.rows:
                log[-1][row.tenant] += row_cost(row)
                queued[row.tenant] -= row_cost(row)
            if len(log) >= 64:
                window = log[-64:]
                total = sum(sum(c.values()) for c in window)
                for tenant in TENANTS:
                    share = sum(c[tenant] for c in window) / total
                    due = table.weight(tenant) / sum(weights)
                    assert abs(share - due) <= 0.1 * due, f"{tenant}: {share:.3f} of the tokens, due {due:.3f}"
                windows += 1
        done = running.pop(0)
        scheduler.complete(done, [None] * len(done.rows))
    assert windows > 0 and expressed > 0
