"""R-FAIR-2/3: the weighted deficit round robin of `domain/scheduling/fairness.py` against a simple model.

Rules queue requests of several tenants (weights, priorities, any lengths), cancel them, and take
rounds of any size (the caller's `room` says how many rows the round holds), in the ring's order
or some tenants' turns early (`take_ahead`). Checked at every
row taken:
- it is its tenant's next row: interactive rows in arrival order first, then batch rows in
  arrival order, except that a batch row orders by arrival among the interactive ones once its
  tenant has taken `AGING_QUANTA` quanta (× its weight) of counted tokens since it was queued;
- a tenant with nothing queued takes nothing, and a tenant never takes more than the quanta of
  the turns it had since it last became backlogged (an idle tenant banks no credit);
- no row waits more than `turn_bound` turns of its tenant (the bound the module states:
  ⌈(A + L) / (quantum × weight)⌉ + 1, a batch row AGING_QUANTA + ⌈(A + 2L) / (quantum × weight)⌉
  + 1, A the counted tokens of its tenant queued up to it when it arrived, L the tenant's
  longest row);
- `take_ahead` (R-FAIR-7) gives rows of the named tenants only, in the same per-tenant order and
  under the same bounds, never a second turn early to a tenant ahead already, and no tenant is
  more than its longest row's turns ahead of the ring.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from vllm_srun.domain.scheduling.fairness import AGING_QUANTA, FairQueue, row_cost, turn_bound
from vllm_srun.domain.scheduling.rows import Row
from vllm_srun.domain.scheduling.tenants import Priority, TenantPolicy, TenantTable

TENANTS = ("a", "b", "c")


@dataclass
class Queued:
    row: Row
    turns: int  # the tenant's turns when it was queued
    since: int  # counted tokens its tenant had taken (since it became backlogged) when it was queued
    ahead: int  # counted tokens of its tenant queued up to it, it included


class FairQueueMachine(RuleBasedStateMachine):
    @initialize(
        weights=st.tuples(*(st.sampled_from([0.5, 1.0, 2.0, 3.0]) for _ in TENANTS)),
        quantum=st.sampled_from([8.0, 24.0, 64.0, 200.0]),
    )
    def start(self, weights: tuple[float, ...], quantum: float) -> None:
        self.table = TenantTable({t: TenantPolicy(weight=w) for t, w in zip(TENANTS, weights)})
        self.queue = FairQueue(self.table.weight)
        self.quantum = quantum
        self.model: dict[str, list[Queued]] = {t: [] for t in TENANTS}
        self.next_request = 0
        self.seq = 0
        self.longest = dict.fromkeys(TENANTS, 0)
        self.joined_at: dict[str, int] = {}  # tenant → its turns when it last became backlogged
        self.served_since_join = dict.fromkeys(TENANTS, 0)
        self.taken = 0
        self.together: frozenset[str] = frozenset()  # the tenants backlogged since `reference`
        self.reference: dict[str, int] = {}  # their turns when they became those

    @rule(
        tenant=st.sampled_from(TENANTS),
        batch=st.booleans(),
        lengths=st.lists(st.integers(1, 200), min_size=1, max_size=6),
    )
    def push(self, tenant: str, batch: bool, lengths: list[int]) -> None:
        priority = Priority.BATCH if batch else Priority.INTERACTIVE
        rid = self.next_request
        self.next_request += 1
        if not self.model[tenant]:
            self.joined_at[tenant] = self.queue.turns(tenant)
            self.served_since_join[tenant] = 0
        for index, n in enumerate(lengths):
            row = Row(rid, index, n, "text", self.seq, None, tenant, priority)
            self.seq += 1
            turns = self.queue.turns(tenant)
            self.queue.push(row)
            self.longest[tenant] = max(self.longest[tenant], row_cost(row))
            queued = Queued(row, turns, self.served_since_join[tenant], self.queue.tokens_of(tenant))
            self.model[tenant].append(queued)

    @precondition(lambda self: any(self.model.values()))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        queued = sorted({q.row.request_id for rows in self.model.values() for q in rows})
        rid = data.draw(st.sampled_from(queued))
        self.queue.remove_request(rid)
        for tenant in TENANTS:
            self.model[tenant] = [q for q in self.model[tenant] if q.row.request_id != rid]

    @precondition(lambda self: any(self.model.values()))
    @rule(rows=st.integers(1, 25))
    def take(self, rows: int) -> None:
        room_left = [rows]

        def room(row: Row) -> bool:
            if room_left[0] == 0:
                return False
            room_left[0] -= 1
            self._check_taken(row)
            return True

        taken = self.queue.take(self.quantum, room)
        assert 1 <= len(taken) <= rows
        self.taken += len(taken)

    @precondition(lambda self: any(self.model.values()))
    @rule(data=st.data(), rows=st.integers(1, 25))
    def take_ahead(self, data: st.DataObject, rows: int) -> None:
        """The express forward's take (R-FAIR-7): some backlogged tenants have their next turn early."""
        backlogged = sorted(t for t, queued in self.model.items() if queued)
        names = frozenset(data.draw(st.lists(st.sampled_from(backlogged), min_size=1, unique=True)))
        was_ahead = {t for t in names if self.queue.ahead(t)}
        room_left = [rows]

        def room(row: Row) -> bool:
            assert row.tenant in names, f"{row.tenant} gave a row to another tenant's turn early"
            if room_left[0] == 0:
                return False
            room_left[0] -= 1
            self._check_taken(row)
            return True

        taken = self.queue.take_ahead(names, self.quantum, room)
        assert not {r.tenant for r in taken} & was_ahead, "a tenant had a second turn early"
        self.taken += len(taken)

    def _expected_next(self, tenant: str) -> Queued:
        queued = self.model[tenant]
        interactive = [q for q in queued if q.row.priority is Priority.INTERACTIVE]
        batch = [q for q in queued if q.row.priority is Priority.BATCH]
        aging = AGING_QUANTA * self.quantum * self.table.weight(tenant)
        if batch and (
            not interactive
            or (self.served_since_join[tenant] - batch[0].since >= aging and batch[0].row.seq < interactive[0].row.seq)
        ):
            return batch[0]
        return interactive[0]

    def _check_taken(self, row: Row) -> None:
        tenant = row.tenant
        assert self.model[tenant], "a tenant with nothing queued took a row"
        expected = self._expected_next(tenant)
        assert row == expected.row, f"{tenant} gave {row} before {expected.row}"
        self.model[tenant].remove(expected)
        turns = self.queue.turns(tenant)
        weight = self.table.weight(tenant)
        bound = turn_bound(expected.ahead, self.longest[tenant], self.quantum, weight, row.priority)
        assert turns - expected.turns <= bound, f"waited {turns - expected.turns} turns, bound {bound}"
        self.served_since_join[tenant] += row_cost(row)
        quanta = (turns - self.joined_at[tenant]) * self.quantum * weight
        assert self.served_since_join[tenant] <= quanta + 1e-6, "a tenant took more than its turns gave it"

    def _most_ahead(self, tenant: str) -> int:
        """The turns TENANT's longest row needs: the most it may be ahead of the ring."""
        return max(1, -(-self.longest[tenant] // (self.quantum * self.table.weight(tenant))))

    @invariant()
    def no_tenant_is_more_than_a_row_ahead(self) -> None:
        for tenant, queued in self.model.items():
            assert self.queue.ahead(tenant) <= self._most_ahead(tenant), (
                f"{tenant} is {self.queue.ahead(tenant)} turns ahead of the ring"
            )
            if not queued:
                assert self.queue.ahead(tenant) == 0, "a tenant with nothing queued keeps turns it had early"

    @invariant()
    def backlogged_tenants_have_as_many_turns(self) -> None:
        """While the same tenants stay backlogged, their turns grow together: between two turns of
        a tenant every other one has one, give or take the turns it had early."""
        now = self.queue.tenants()
        if now != self.together:
            self.together, self.reference = now, {t: self.queue.turns(t) for t in now}
            return
        had = {t: self.queue.turns(t) - self.reference[t] for t in now}
        early = max((self._most_ahead(t) for t in now), default=0)
        assert max(had.values(), default=0) - min(had.values(), default=0) <= 1 + early, f"turns since: {had}"

    @invariant()
    def counts_match(self) -> None:
        assert len(self.queue) == sum(len(rows) for rows in self.model.values())
        assert self.queue.tenants() == frozenset(t for t, rows in self.model.items() if rows)
        for tenant, rows in self.model.items():
            assert self.queue.tokens_of(tenant) == sum(row_cost(q.row) for q in rows)
        assert [r.seq for r in self.queue.rows()] == sorted(q.row.seq for rows in self.model.values() for q in rows)


TestFairQueue = FairQueueMachine.TestCase
TestFairQueue.settings = settings(max_examples=200, stateful_step_count=50, deadline=None)
