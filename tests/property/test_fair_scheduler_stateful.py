"""R-FAIR-2: the scheduler shares forwards across tenants (a FakeForward, a FakeClock).

Rules submit requests for tenants of different weights (interactive or batch), flood a tenant
with many requests at once, cancel requests, advance the clock and run forwards. Checked:
- under saturation (every tenant of the round had rows queued before it and still has after
  it) each backlogged tenant's share of the forwards' counted tokens over any window of 64
  forwards is within 10 % of its weight share (|share − w/Σw| ≤ 0.1 × w/Σw), for rows up to 64
  tokens, forwards of 1,024 or 2,048 tokens, weights 1 to 3;
- a tenant with no rows queued or planned is in no forward;
- a round planned while several tenants are queued ends once the lightest one's rows (least
  counted tokens ÷ weight) are in it: every other tenant gives it at most the turns it has while
  the lightest takes its rows (`turn_bound` of the lightest's last row) and the row its previous
  turn left over: ≤ turns × quantum × weight + 64 counted tokens each (R-FAIR-6);
- every request is answered once, in its rows' order, and each tenant's answers equal the ones
  the same requests get from a scheduler that serves that tenant alone.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tests.fakes import FakeClock, FakeForward
from vllm_srun.domain.scheduling.fairness import row_cost, turn_bound
from vllm_srun.domain.scheduling.lanes import Accounting, Lane
from vllm_srun.domain.scheduling.planning import Budget, ForwardBatch
from vllm_srun.domain.scheduling.rows import Row, RowSpec
from vllm_srun.domain.scheduling.scheduler import Scheduler
from vllm_srun.domain.scheduling.tenants import Priority, TenantPolicy, TenantTable

TENANTS = ("a", "b", "c")
WINDOW = 64  # forwards
TOLERANCE = 0.10  # of the weight share


@dataclass
class Sent:
    tenant: str
    priority: Priority
    specs: list[RowSpec]


@dataclass
class Ran:
    tokens: Counter[str]  # counted tokens of each tenant's rows in the forward
    saturated: frozenset[str] | None  # the tenants backlogged through its round (None: not a shared round)


def build(lanes: list[Lane], budget: Budget, window_s: float, table: TenantTable) -> Scheduler:
    return Scheduler(lanes, budget, window_s=window_s, tenants=table)


class FairSchedulerMachine(RuleBasedStateMachine):
    @initialize(
        weights=st.tuples(*(st.sampled_from([1.0, 2.0, 3.0]) for _ in TENANTS)),
        max_tokens=st.sampled_from([1024, 2048]),
        packed=st.booleans(),
        window_ms=st.sampled_from([0.0, 2.0]),
    )
    def start(self, weights: tuple[float, ...], max_tokens: int, packed: bool, window_ms: float) -> None:
        self.clock = FakeClock()
        self.engine = FakeForward()
        self.table = TenantTable({t: TenantPolicy(weight=w) for t, w in zip(TENANTS, weights)})
        self.lanes = [Lane("text", Accounting.PACKED if packed else Accounting.PADDED)]
        self.budget = Budget(256, max_tokens)
        self.window_s = window_ms / 1000
        self.scheduler = build(self.lanes, self.budget, self.window_s, self.table)
        self.sent: dict[int, Sent] = {}
        self.order: list[int] = []
        self.cancelled: set[int] = set()
        self.answered: dict[int, tuple] = {}
        self.log: list[Ran] = []
        self.windows_checked = 0

    def _submit(self, tenant: str, priority: Priority, lengths: list[int]) -> None:
        number = len(self.order)
        specs = [RowSpec(n, (number, i)) for i, n in enumerate(lengths)]
        rid = self.scheduler.submit(specs, self.clock.now(), tenant=tenant, priority=priority)
        self.sent[rid] = Sent(tenant, priority, specs)
        self.order.append(rid)

    @rule(
        tenant=st.sampled_from(TENANTS),
        batch=st.booleans(),
        lengths=st.lists(st.integers(1, 64), min_size=1, max_size=6),
    )
    def submit(self, tenant: str, batch: bool, lengths: list[int]) -> None:
        self._submit(tenant, Priority.BATCH if batch else Priority.INTERACTIVE, lengths)

    @rule(
        tenant=st.sampled_from(TENANTS), requests=st.integers(50, 600), seed=st.integers(0, 2**16), batch=st.booleans()
    )
    def flood(self, tenant: str, requests: int, seed: int, batch: bool) -> None:
        rng = random.Random(seed)
        for _ in range(requests):
            lengths = [rng.randint(1, 64) for _ in range(rng.randint(1, 8))]
            self._submit(tenant, Priority.BATCH if batch else Priority.INTERACTIVE, lengths)

    @precondition(lambda self: self._open())
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self._open())))
        assert self.scheduler.cancel(rid)
        self.cancelled.add(rid)

    @rule(ms=st.sampled_from([0.5, 5.0]))
    def advance(self, ms: float) -> None:
        self.clock.advance(ms / 1000)

    @precondition(lambda self: self._open())
    @rule(forwards=st.integers(1, 150))
    def run(self, forwards: int) -> None:
        for _ in range(forwards):
            if not self._step():
                return

    def _step(self) -> bool:
        queued = self.scheduler.unplanned_rows
        planned = self.scheduler.planned_forwards
        had_plan = bool(planned)
        holding = {r.tenant for r in queued} | {r.tenant for b in planned for r in b.rows}
        batch = self.scheduler.next_forward(self.clock.now())
        if batch is None:
            self.clock.advance(self.window_s + 0.001)
            batch = self.scheduler.next_forward(self.clock.now())
            if batch is None:
                return False
        assert {r.tenant for r in batch.rows} <= holding, "a tenant with nothing queued is in a forward"
        if not had_plan:
            self._check_light_round(queued, batch)
        saturated = None
        if not had_plan:
            before = frozenset(r.tenant for r in queued)
            after = frozenset(r.tenant for r in self.scheduler.unplanned_rows)
            shared = len({(r.tenant, r.priority) for r in queued}) > 1
            if shared and len(before) > 1 and after == before:
                assert not self.scheduler.planned_forwards, "a shared round is one forward per lane"
                saturated = before
        self._finish(batch)
        self.log.append(Ran(_tokens(batch), saturated))
        self._check_last_window()
        return True

    def _finish(self, batch: ForwardBatch) -> None:
        outputs = self.engine.run(batch.lane, [r.payload for r in batch.rows])
        for answer in self.scheduler.complete(batch, outputs):
            assert answer.request_id not in self.answered, "answered twice"
            assert answer.request_id not in self.cancelled
            number = self.order.index(answer.request_id)
            assert answer.outputs == tuple((number, i) for i in range(len(self.sent[answer.request_id].specs)))
            self.answered[answer.request_id] = answer.outputs

    def _check_light_round(self, queued: tuple[Row, ...], batch: ForwardBatch) -> None:
        """R-FAIR-6: a round beside the lightest tenant holds the other tenants' turns meanwhile."""
        asked: Counter[str] = Counter()
        longest: Counter[str] = Counter()
        for row in queued:
            asked[row.tenant] += row_cost(row)
            longest[row.tenant] = max(longest[row.tenant], row_cost(row))
        if len(asked) < 2:
            return  # one tenant: the whole queue is planned, or its priorities share the round
        quantum = self.scheduler.quantum
        least = min(asked[t] / self.table.weight(t) for t in asked)
        light = {t for t in asked if asked[t] / self.table.weight(t) == least}
        turns = max(
            turn_bound(asked[t], longest[t], quantum, self.table.weight(t), Priority.INTERACTIVE) for t in light
        )
        if currently_in_test_context():
            event("a round beside the lightest tenant")
        took = _tokens(batch)
        for tenant in asked.keys() - light:
            bound = turns * quantum * self.table.weight(tenant) + 64
            assert took[tenant] <= bound, (
                f"{tenant} gave {took[tenant]} tokens to a round beside lightest {sorted(light)} (bound {bound:.0f})"
            )

    def _check_last_window(self) -> None:
        window = self.log[-WINDOW:]
        if len(window) < WINDOW:
            return
        tenants = window[0].saturated
        if tenants is None or any(ran.saturated != tenants for ran in window):
            return
        total = sum(sum(ran.tokens[t] for t in tenants) for ran in window)
        weights = {t: self.table.weight(t) for t in tenants}
        for tenant in tenants:
            share = sum(ran.tokens[tenant] for ran in window) / total
            due = weights[tenant] / sum(weights.values())
            assert abs(share - due) <= TOLERANCE * due, (
                f"{tenant}: {share:.3f} of the tokens, its weight's share {due:.3f}"
            )
        self.windows_checked += 1

    def _open(self) -> set[int]:
        return set(self.sent) - set(self.answered) - self.cancelled

    @invariant()
    def pending_is_what_is_open(self) -> None:
        assert self.scheduler.pending_requests == len(self._open())

    def teardown(self) -> None:
        for _ in range(100_000):
            if not self._open() or not self._step():
                break
        if currently_in_test_context():
            event(f"64-forward windows checked: {'some' if self.windows_checked else 'none'}")
        assert not self._open(), "a request was never answered"
        for tenant in TENANTS:
            self._check_alone(tenant)

    def _check_alone(self, tenant: str) -> None:
        """The tenant's requests alone in a scheduler get the answers they got among the others."""
        mine = [rid for rid in self.order if self.sent[rid].tenant == tenant and rid in self.answered]
        alone = build(self.lanes, self.budget, 0.0, self.table)
        ids = {}
        for rid in mine:
            sent = self.sent[rid]
            ids[alone.submit(sent.specs, self.clock.now(), tenant=tenant, priority=sent.priority)] = rid
        answers = {}
        while (batch := alone.next_forward(self.clock.now())) is not None:
            for answer in alone.complete(batch, self.engine.run(batch.lane, [r.payload for r in batch.rows])):
                answers[ids[answer.request_id]] = answer.outputs
        assert answers == {rid: self.answered[rid] for rid in mine}


def _tokens(batch: ForwardBatch) -> Counter[str]:
    counted: Counter[str] = Counter()
    for row in batch.rows:
        counted[row.tenant] += row_cost(row)
    return counted


TestFairScheduler = FairSchedulerMachine.TestCase
TestFairScheduler.settings = settings(max_examples=30, stateful_step_count=25, deadline=None)


def test_flooding_tenants_share_forwards_by_weight() -> None:
    """Two tenants flood at once (weights 1 and 3), a third trickles in: the windows the machine
    checks are there (the property above is not vacuous), and then the trickle is answered."""
    machine = FairSchedulerMachine()
    machine.start(weights=(1.0, 3.0, 2.0), max_tokens=1024, packed=False, window_ms=0.0)
    machine.flood("a", requests=400, seed=1, batch=False)
    machine.flood("b", requests=900, seed=2, batch=True)
    machine.run(forwards=100)
    machine.submit("c", batch=False, lengths=[5, 60])
    machine.run(forwards=100)
    assert machine.windows_checked > 50
    machine.teardown()
