"""Fair sharing of one model across tenants (R-FAIR-2, R-FAIR-3): the queue of rows not planned yet,
taken in weighted deficit round robin order over counted tokens.

Backlogged tenants stand in a ring. At its turn a tenant's deficit grows by `quantum × weight`
and it gives rows while the next one's counted tokens (its length rounded up to 8, R-BAT-2) are
within the deficit, which pays for them; a tenant whose rows run out leaves the ring and its
deficit goes to 0 (no backlog, no credit). `take` hands rows out in exactly that order until the
caller's `room` says the next one would not fit the round being planned; the next round goes on
from the same place in the same turn. So over any stretch in which tenants stay backlogged, each
gets counted tokens in proportion to its weight, within one quantum and one row of it.

`take_ahead` (the express forward, R-FAIR-7) lets named tenants have their next turn early: at
most as many turns as a tenant's next row needs, and only while it has none early already; its
next places in the ring then give it nothing. The order changes, not the shares: a tenant is at
most one row's turns ahead of the ring, and the bounds below count the turns it had early.

Within a tenant, `interactive` rows go before `batch` rows, each kind in arrival order; a batch
row orders by arrival among the interactive ones once its tenant has taken `AGING_QUANTA`
quanta (× its weight) of counted tokens since it was queued (so does a row given back from a
plan), so no row waits forever: a row of tenant i, with A counted tokens of its tenant's rows
queued up to it (it included) and L the counted tokens of the tenant's longest row, is taken
within ⌈(A + L) / (quantum × weight_i)⌉ + 1 turns of its tenant, a batch row within
`AGING_QUANTA` + ⌈(A + 2L) / (quantum × weight_i)⌉ + 1; between two turns of a tenant every
other backlogged tenant has one (`turn_bound`).

Pure: rows in, rows out; no clock.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field

from vllm_srun.domain.scheduling.lanes import round_up
from vllm_srun.domain.scheduling.rows import Row
from vllm_srun.domain.scheduling.tenants import Priority

AGING_QUANTA = 64  # a batch row orders as interactive after its tenant took this many quanta (R-FAIR-3)
QUANTUM_PARTS = 8  # a unit of weight's quantum: an eighth of the smallest forward a lane runs
MAX_REMEMBERED = 4096  # turn counts kept for tenants with nothing queued


def row_cost(row: Row) -> int:
    """What a row costs its tenant: its counted tokens (rounded up to 8, as a packed forward counts)."""
    return round_up(row.tokens)


def turn_bound(ahead_tokens: int, longest: int, quantum: float, weight: float, priority: Priority) -> int:
    """The most turns of its tenant a row waits (see the module docstring)."""
    if priority is Priority.BATCH:
        return AGING_QUANTA + math.ceil((ahead_tokens + 2 * longest) / (quantum * weight)) + 1
    return math.ceil((ahead_tokens + longest) / (quantum * weight)) + 1


@dataclass(slots=True)
class _Entry:
    row: Row
    since: int  # counted tokens its tenant had taken when it was queued (batch aging)
    aged: bool = False  # given back from a plan: it keeps its arrival place


@dataclass(slots=True)
class _Tenant:
    turns: int  # the tenant's turns so far (kept while it is away)
    interactive: deque[_Entry] = field(default_factory=deque)
    batch: deque[_Entry] = field(default_factory=deque)
    deficit: float = 0.0
    tokens: int = 0  # counted tokens queued
    taken: int = 0  # counted tokens taken since it last became backlogged
    ahead: int = 0  # turns it had early (`take_ahead`), which its next places in the ring give nothing

    def __len__(self) -> int:
        return len(self.interactive) + len(self.batch)

    def next_kind(self, share: float) -> deque[_Entry] | None:
        """The deque whose head is this tenant's next row (None: nothing queued); SHARE: its quantum."""
        if not self.batch:
            return self.interactive or None
        if not self.interactive:
            return self.batch
        head = self.batch[0]
        aged = head.aged or self.taken - head.since >= AGING_QUANTA * share
        return self.batch if aged and head.row.seq < self.interactive[0].row.seq else self.interactive


class FairQueue:
    """Queued rows by tenant, handed out in weighted deficit round robin order."""

    def __init__(self, weight: Callable[[str], float]) -> None:
        self._weight = weight
        self._tenants: dict[str, _Tenant] = {}
        self._turns: dict[str, int] = {}  # turns of tenants that left the ring (at most MAX_REMEMBERED)
        self._ring: deque[str] = deque()  # backlogged tenants; the first one's turn is next (or running)
        self._in_turn = False  # the first tenant of the ring has had this turn's quantum
        self._rows = 0
        self._tokens = 0

    # ---- what is queued --------------------------------------------------------------------
    def __len__(self) -> int:
        return self._rows

    @property
    def tokens(self) -> int:
        """Counted tokens queued, all tenants."""
        return self._tokens

    def tenants(self) -> frozenset[str]:
        """The backlogged tenants."""
        return frozenset(self._tenants)

    def tokens_of(self, tenant: str) -> int:
        found = self._tenants.get(tenant)
        return found.tokens if found is not None else 0

    def rows_of(self, tenant: str) -> int:
        found = self._tenants.get(tenant)
        return len(found) if found is not None else 0

    def turns(self, tenant: str) -> int:
        """Turns of the round robin the tenant has had (it never goes down while remembered)."""
        found = self._tenants.get(tenant)
        return found.turns if found is not None else self._turns.get(tenant, 0)

    def ahead(self, tenant: str) -> int:
        """Turns the tenant had early (`take_ahead`) that its places in the ring have not met yet."""
        found = self._tenants.get(tenant)
        return found.ahead if found is not None else 0

    def single_kind(self) -> tuple[str, Priority] | None:
        """The (tenant, priority) every queued row shares; None when they differ or none is queued."""
        if len(self._tenants) != 1:
            return None
        name, tenant = next(iter(self._tenants.items()))
        if tenant.interactive and tenant.batch:
            return None
        return name, Priority.INTERACTIVE if tenant.interactive else Priority.BATCH

    def rows(self) -> tuple[Row, ...]:
        """Every queued row, in arrival order."""
        return tuple(
            sorted((e.row for t in self._tenants.values() for q in (t.interactive, t.batch) for e in q), key=_seq)
        )

    def lanes(self) -> set[str]:
        """The lanes of the queued rows."""
        return {e.row.lane for t in self._tenants.values() for q in (t.interactive, t.batch) for e in q}

    def oldest(self) -> Row | None:
        """The queued row that arrived first."""
        heads = [q[0].row for t in self._tenants.values() for q in (t.interactive, t.batch) if q]
        return min(heads, key=_seq) if heads else None

    # ---- in and out ------------------------------------------------------------------------
    def push(self, row: Row) -> None:
        """Queue a row behind its tenant's rows of its priority."""
        tenant = self._tenant(row.tenant)
        (tenant.batch if row.priority is Priority.BATCH else tenant.interactive).append(_Entry(row, tenant.taken))
        self._count(tenant, row, +1)

    def restore(self, rows: Iterable[Row]) -> None:
        """Put back rows taken before (a plan given up): each in its arrival place."""
        touched: set[str] = set()
        for row in rows:
            tenant = self._tenant(row.tenant)
            aged = _Entry(row, tenant.taken, aged=True)  # it keeps its arrival place among the interactive
            (tenant.batch if row.priority is Priority.BATCH else tenant.interactive).append(aged)
            self._count(tenant, row, +1)
            touched.add(row.tenant)
        for name in touched:
            tenant = self._tenants[name]
            tenant.interactive = deque(sorted(tenant.interactive, key=_entry_seq))
            tenant.batch = deque(sorted(tenant.batch, key=_entry_seq))

    def remove_request(self, request_id: int, indices: Collection[int] | None = None) -> None:
        """Drop every queued row of a request (INDICES: only the rows at those places in it)."""

        def dropped(row: Row) -> bool:
            return row.request_id == request_id and (indices is None or row.index in indices)

        for name in list(self._tenants):
            tenant = self._tenants[name]
            for kind in (tenant.interactive, tenant.batch):
                gone = [e for e in kind if dropped(e.row)]
                if gone:
                    kept = [e for e in kind if not dropped(e.row)]
                    kind.clear()
                    kind.extend(kept)
                    for e in gone:
                        self._count(tenant, e.row, -1)
            if not tenant:
                self._leave(name)

    def take_all(self) -> list[Row]:
        """Every queued row, in arrival order; the round robin starts afresh."""
        rows = list(self.rows())
        for name in list(self._tenants):
            self._leave(name)
        self._ring.clear()
        self._in_turn = False
        self._rows = self._tokens = 0
        return rows

    def take(self, quantum: float, room: Callable[[Row], bool]) -> list[Row]:
        """Rows in round robin order while ROOM(row) takes them (it says False once the round is
        full: that row stays first in line). QUANTUM: counted tokens a turn gives a unit of weight."""
        if quantum <= 0:
            raise ValueError("the quantum must be > 0")
        taken: list[Row] = []
        idle_turns = 0  # turns in a row that gave nothing: a whole ring of them skips ahead
        while self._ring:
            name = self._ring[0]
            tenant = self._tenants[name]
            share = quantum * self._weight(name)
            if not self._in_turn:
                if idle_turns >= len(self._ring):
                    self._skip_idle_rings(quantum)
                    idle_turns = 0
                if tenant.ahead:  # it had this turn early
                    tenant.ahead -= 1
                else:
                    tenant.deficit += share
                    tenant.turns += 1
                self._in_turn = True
                idle_turns += 1
            kind = tenant.next_kind(share)
            assert kind is not None  # a tenant in the ring has rows
            row = kind[0].row
            cost = row_cost(row)
            if cost > tenant.deficit:  # its turn is over
                self._ring.rotate(-1)
                self._in_turn = False
                continue
            if not room(row):
                break
            taken.append(self._give(tenant, kind))
            idle_turns = 0
            if not tenant:
                self._leave(name)
        return taken

    def take_ahead(self, names: frozenset[str], quantum: float, room: Callable[[Row], bool]) -> list[Row]:
        """The rows of NAMES before their places in the ring come (R-FAIR-7: the tenants asking
        least, on the express forward): each of them that is not ahead already has its next turn
        now (as many turns as its next row needs) and gives rows, in its own order, while they are
        within its deficit and ROOM takes them; its next places in the ring give it nothing (it had
        those turns). The others keep their places and credit. So the order changes, not the
        shares: a tenant is at most one row's turns ahead of the ring, and `take`'s bounds hold."""
        if quantum <= 0:
            raise ValueError("the quantum must be > 0")
        taken: list[Row] = []
        for name in [n for n in self._ring if n in names]:
            tenant = self._tenants[name]
            if tenant.ahead:
                continue
            share = quantum * self._weight(name)
            kind = tenant.next_kind(share)
            assert kind is not None  # a tenant in the ring has rows
            turns = max(1, math.ceil((row_cost(kind[0].row) - tenant.deficit) / share))
            tenant.deficit += turns * share
            tenant.turns += turns
            tenant.ahead = turns
            full = False
            while (kind := tenant.next_kind(share)) is not None and row_cost(kind[0].row) <= tenant.deficit:
                full = not room(kind[0].row)
                if full:
                    break
                taken.append(self._give(tenant, kind))
            if not tenant:
                self._leave(name)
            if full:
                break
        return taken

    # ---- internals -------------------------------------------------------------------------
    def _give(self, tenant: _Tenant, kind: deque[_Entry]) -> Row:
        """The head row of KIND, one of TENANT's deques, taken out and paid from its deficit."""
        row = kind.popleft().row
        cost = row_cost(row)
        tenant.deficit -= cost
        tenant.taken += cost
        self._count(tenant, row, -1)
        return row

    def _skip_idle_rings(self, quantum: float) -> None:
        """A whole ring of turns gave nothing (every next row costs more than its deficit): give
        every tenant the turns that change nothing at once, up to the first that gives a row (a
        tenant's turns had early count among them: they give nothing)."""
        need = []
        for name in self._ring:
            tenant = self._tenants[name]
            share = quantum * self._weight(name)
            kind = tenant.next_kind(share)
            assert kind is not None
            need.append(tenant.ahead + math.ceil((row_cost(kind[0].row) - tenant.deficit) / share))
        skip = max(0, min(need) - 1)
        for name in self._ring:
            tenant = self._tenants[name]
            early = min(skip, tenant.ahead)
            tenant.ahead -= early
            tenant.deficit += (skip - early) * quantum * self._weight(name)
            tenant.turns += skip - early

    def _tenant(self, name: str) -> _Tenant:
        tenant = self._tenants.get(name)
        if tenant is None:
            tenant = self._tenants[name] = _Tenant(self._turns.pop(name, 0))
            self._ring.append(name)  # newly backlogged: last in the ring, no credit
        return tenant

    def _leave(self, name: str) -> None:
        """A tenant without rows leaves the ring and forgets its deficit."""
        if len(self._turns) >= MAX_REMEMBERED:
            self._turns.clear()
        self._turns[name] = self._tenants.pop(name).turns
        if self._ring and self._ring[0] == name:
            self._in_turn = False
        self._ring.remove(name)

    def _count(self, tenant: _Tenant, row: Row, sign: int) -> None:
        cost = row_cost(row)
        tenant.tokens += sign * cost
        self._tokens += sign * cost
        self._rows += sign


def _seq(row: Row) -> int:
    return row.seq


def _entry_seq(entry: _Entry) -> int:
    return entry.row.seq
