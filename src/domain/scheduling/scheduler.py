"""One model's scheduler: rows in, forwards out, answers back (R-BAT-1…7).

Plan, then apply: `next_forward(now)` hands out the next forward of the current plan (planning
a new round from the whole queue when the window allows), the engine runs it, and
`complete(batch, outputs)` / `fail(batch, error)` answer every request whose last row ran.
Up to `max_in_flight` forwards may run at once (a CPU worker that runs several single-team
forwards side by side, R-CPU-1; 1 everywhere else); a forward is handed out only while a slot is
free, and the window counts as busy only while every slot is taken.
The scheduler never touches a device, a clock or a thread: time is passed in.

Deadlines (R-API-10): `expire(request, rows)` gives up the request's rows that have not reached a
device (queued or planned); each answers `EXPIRED` in its place, the rows already running finish,
and the request is answered once none of its rows is left. The caller decides when (its clock).

Tenants (R-FAIR-2, R-FAIR-3): while every queued row has one tenant and one priority, a round
plans the whole queue, as above. Otherwise a round takes rows in the weighted deficit round robin
order of `domain/scheduling/fairness.py` until one more would not fit the round's forward of its lane, or
until every row of the tenant asking least is in it (R-FAIR-6: a light tenant beside a flood
rides a short forward), so a round is at most one forward per lane and tenants mix in it; the
rows' answers never depend on the mix. A whole-queue plan still waiting for the device is given
back to the queue when rows of another tenant (or interactive rows of its batch tenant) arrive,
so they never wait behind it. While every slot is busy, `next_express` hands out the rows of the
tenant asking least (its next turn, had early) to run beside them when another tenant asks more
(R-FAIR-7, `domain/scheduling/tenant_express.py`), one at a time: it does not count against the slots.

Lanes (R-BAT-6): before a plan's next forward, the plan is given back when rows of a lane that
costs less per token than a lane it still holds have queued, so a new round runs them first (a
text row waits for at most one image forward besides the one running); it gives way again only
after a forward of the costlier lane has run, so a stream of cheap rows never starves the costly
lane. While every slot runs a forward of a costlier lane, the cheaper lane's rows do not wait
for one: `next_express` hands them out on express forwards (`domain/scheduling/lane_express.py`), as
many at once as there are slots, so the cheap lane keeps the concurrency the slots would give it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Sequence
from typing import Any

from vllm_srun.domain.scheduling.answers import EXPIRED, Answer, Pending
from vllm_srun.domain.scheduling.costs import CostModel
from vllm_srun.domain.scheduling.fairness import QUANTUM_PARTS, FairQueue
from vllm_srun.domain.scheduling.lane_express import lane_express_forward
from vllm_srun.domain.scheduling.lanes import TOKEN_ALIGN, Accounting, Lane, forward_tokens, round_up
from vllm_srun.domain.scheduling.planning import (
    BATCH_INVARIANT_TOKENS,
    Budget,
    ForwardBatch,
    lane_token_limit,
    plan_forwards,
)
from vllm_srun.domain.scheduling.rows import Row, RowSpec
from vllm_srun.domain.scheduling.tenant_express import least_asking, tenant_express_forward
from vllm_srun.domain.scheduling.tenants import DEFAULT_TENANT, DEFAULT_TENANTS, Priority, TenantTable
from vllm_srun.domain.scheduling.window import BatchWindow, WindowState


class Scheduler:
    def __init__(
        self,
        lanes: Sequence[Lane],
        budget: Budget,
        *,
        window_s: float,
        batch_invariant: bool = False,
        invariant_tokens: int = BATCH_INVARIANT_TOKENS,
        costs: CostModel | None = None,
        max_in_flight: int = 1,
        tenants: TenantTable = DEFAULT_TENANTS,
    ) -> None:
        if not lanes:
            raise ValueError("a model declares at least one lane")
        if not 8 <= invariant_tokens <= BATCH_INVARIANT_TOKENS:
            raise ValueError(f"invariant_tokens must be 8..{BATCH_INVARIANT_TOKENS}, got {invariant_tokens}")
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        self.lanes = {lane.name: lane for lane in lanes}
        self.budget = budget
        self.batch_invariant = batch_invariant
        self.invariant_tokens = invariant_tokens  # a batch-invariant model's merged-forward cap (R-BAT-5)
        self.window = BatchWindow(0.0 if batch_invariant else window_s)
        self.costs = costs or CostModel()
        self.tenants = tenants
        self._requests: dict[int, Pending] = {}
        self._queue = FairQueue(tenants.weight)
        self._plan: deque[ForwardBatch] = deque()
        self._plan_kind: tuple[str, Priority] | None = None  # the one (tenant, priority) a whole-queue plan holds
        self._may_cut_in = True  # no cut-in forward since the plan's last one (`_cut_in`)
        # the cost per token of the lane the plan last gave way to (R-BAT-6), until a forward of a
        # costlier lane runs (`_gives_way`)
        self._gave_way_to: float | None = None
        # forwards handed out and not completed yet: at most MAX_IN_FLIGHT (concurrent forwards of
        # one CPU worker, each on its own share of the cores; 1 elsewhere)
        self.max_in_flight = max_in_flight
        self._in_flight: list[ForwardBatch] = []
        self._express: list[ForwardBatch] = []  # `next_express`'s forwards while they run
        self._lane_express_running: list[ForwardBatch] = []  # those of them the lane express handed out
        self._next_request = 0
        self._next_seq = 0

    # ---- intake ---------------------------------------------------------------------------
    def submit(
        self,
        rows: Sequence[RowSpec],
        now: float,
        *,
        tenant: str = DEFAULT_TENANT,
        priority: Priority | None = None,
        exact: bool = False,
    ) -> int:
        """Queue a request's ROWS for TENANT; PRIORITY None (the request asked for none) is
        `automatic_priority`'s choice. EXACT: the request's profile does not coalesce (R-PROF-2):
        unless the model is batch-invariant, each of its rows runs in a forward of its own."""
        if not rows:
            raise ValueError("a request takes at least one row")
        unknown = {spec.lane for spec in rows} - self.lanes.keys()
        if unknown:
            raise ValueError(f"unknown lane(s) {sorted(unknown)}")
        if priority is None:
            priority = self.automatic_priority(rows)
        rid = self._next_request
        self._next_request += 1
        self._requests[rid] = Pending(rows=len(rows), arrival=now, outputs=[None] * len(rows))
        for index, spec in enumerate(rows):
            self._queue.push(
                Row(rid, index, spec.tokens, spec.lane, self._next_seq, spec.payload, tenant, priority, exact)
            )
            self._next_seq += 1
        kind = self._plan_kind
        if kind is not None and tenant != kind[0]:
            self._unplan()  # another tenant: the next rounds share the plan's rows fairly (R-FAIR-2)
        # the plan's own tenant: its interactive rows cut in ahead of a batch plan (`_cut_in`)
        return rid

    def automatic_priority(self, rows: Sequence[RowSpec]) -> Priority:
        """A request that asked for no priority runs `interactive` when its rows fit one forward
        (its counted tokens within the smallest lane's forward limit, its rows within
        `max_num_seqs`), else `batch` (R-FAIR-3): a request larger than a forward cannot hold
        up its own tenant's small ones for all its forwards, and it still runs at the whole
        speed of the device when nothing else is queued (batch rows age into interactive order)."""
        tokens = sum(round_up(spec.tokens) for spec in rows)
        fits = len(rows) <= self.budget.max_num_seqs and tokens <= min(
            self._limit(lane) for lane in self.lanes.values()
        )
        return Priority.INTERACTIVE if fits else Priority.BATCH

    def _gives_way(self) -> bool:
        """Whether the waiting plan goes back to the queue for the rows queued since: one of their
        lanes costs less per token than a lane the plan holds, and a forward of a costlier lane
        has run since the plan last gave way (module doc). Records the give-way."""
        if not self._plan or len(self.lanes) < 2 or self._gave_way_to is not None or not self._queue:
            return False
        cheapest = min(self.costs.seconds_per_token(name) for name in self._queue.lanes())
        if not any(self.costs.seconds_per_token(b.lane) > cheapest for b in self._plan):
            return False
        self._gave_way_to = cheapest
        return True

    def _ran(self, batch: ForwardBatch) -> None:
        """BATCH leaves the plan for a device: a forward of a lane costlier than the one the plan
        last gave way to (or nothing costlier left waiting in the plan) lets it give way again."""
        cheap = self._gave_way_to
        if cheap is not None and (
            self.costs.seconds_per_token(batch.lane) > cheap
            or not any(self.costs.seconds_per_token(b.lane) > cheap for b in self._plan)
        ):
            self._gave_way_to = None

    def _unplan(self) -> None:
        """Give the waiting whole-queue plan back to the queue: the next rounds share it fairly."""
        rows = [r for batch in self._plan for r in batch.rows if r.request_id in self._requests]
        self._plan.clear()
        self._plan_kind = None
        self._queue.restore(rows)

    def cancel(self, request_id: int) -> bool:
        """Drop a request: its rows that have not reached a device never will."""
        if self._requests.pop(request_id, None) is None:
            return False
        self._queue.remove_request(request_id)
        return True

    def expire(self, request_id: int, indices: Collection[int] | None = None) -> Answer | None:
        """The request's deadline passed for its rows at INDICES (None: all of them): those not
        handed to a device yet (queued or planned) never will be, and answer `EXPIRED`; the ones
        running finish. The request's answer once no row of it is left, else None (then its last
        running row answers it, `complete`)."""
        pending = self._requests.get(request_id)
        if pending is None:
            return None

        def due(row: Row) -> bool:
            return row.request_id == request_id and (indices is None or row.index in indices)

        waiting = [r for r in self._queue.rows() if due(r)] + [r for b in self._plan for r in b.rows if due(r)]
        if not waiting:
            return None
        self._queue.remove_request(request_id, {r.index for r in waiting})
        kept = (self._without(b, due) for b in self._plan)
        self._plan = deque(b for b in kept if b is not None)
        for row in waiting:
            pending.outputs[row.index] = EXPIRED
            pending.done += 1
        if pending.done < pending.rows:
            return None
        del self._requests[request_id]
        return Answer(request_id, tuple(pending.outputs))

    def set_budget(self, budget: Budget) -> None:
        """New batching limits (a calibrated token budget, R-DEV-2) for every plan from now on."""
        self.budget = budget

    # ---- planning -------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        """Every forward slot is taken: arrivals wait for the next plan."""
        return len(self._in_flight) - len(self._express) >= self.max_in_flight

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    @property
    def queued_rows(self) -> int:
        return len(self._queue) + sum(len(b.rows) for b in self._plan)

    @property
    def pending_requests(self) -> int:
        return len(self._requests)

    @property
    def unplanned_rows(self) -> tuple[Row, ...]:
        """The queued rows no plan holds yet, in arrival order (the next plan takes them all while
        they share one tenant and priority)."""
        return self._queue.rows()

    @property
    def planned_forwards(self) -> tuple[ForwardBatch, ...]:
        """The forwards planned and not handed out yet, in the order they will be."""
        return tuple(self._plan)

    def _limit(self, lane: Lane) -> int:
        return lane_token_limit(lane, self.budget, self.costs, self.batch_invariant, self.invariant_tokens)

    def _full(self) -> bool:
        return len(self._queue) >= self.budget.max_num_seqs or self._queue.tokens >= min(
            self._limit(lane) for lane in self.lanes.values()
        )

    @property
    def quantum(self) -> float:
        """Counted tokens one turn of the round robin gives a unit of weight (R-FAIR-2): an
        eighth of the smallest forward a lane may run, at least 8."""
        return float(max(TOKEN_ALIGN, min(self._limit(lane) for lane in self.lanes.values()) // QUANTUM_PARTS))

    def turns(self, tenant: str) -> int:
        """Turns of the round robin the tenant has had since it last became backlogged."""
        return self._queue.turns(tenant)

    def turns_ahead(self, tenant: str) -> int:
        """Turns the tenant had early on an express forward that the ring has not met yet (R-FAIR-7)."""
        return self._queue.ahead(tenant)

    def window_state(self, now: float) -> WindowState:
        return self.window.state(
            now=now, oldest_arrival=self._oldest_arrival(), busy=self.busy, full=bool(self._queue) and self._full()
        )

    def _oldest_arrival(self) -> float | None:
        """Arrival of the oldest queued row's request."""
        oldest = self._queue.oldest()
        return self._requests[oldest.request_id].arrival if oldest is not None else None

    def wake_at(self) -> float | None:
        """When the open window closes (None: nothing waits on the clock)."""
        if self.busy or self._plan or not self._queue:
            return None
        oldest = self._oldest_arrival()
        return None if oldest is None else self.window.closes_at(oldest)

    def next_forward(self, now: float) -> ForwardBatch | None:
        """The next forward to run now, or None (every slot busy, nothing queued, or window open)."""
        if self.busy:
            return None
        while True:
            cut = self._cut_in(now)
            if cut is not None:
                self._in_flight.append(cut)
                return cut
            if self._gives_way():
                self._unplan()  # a cheaper lane queued: this round runs its rows first (R-BAT-6)
            while self._plan:
                batch = self._live(self._plan.popleft())
                if batch is not None:
                    self._may_cut_in = True
                    self._ran(batch)
                    self._in_flight.append(batch)
                    return batch
            if self.window_state(now) is not WindowState.DUE:
                return None
            kind = self._queue.single_kind()
            if kind is not None:
                rows = self._queue.take_all()
            else:
                rows = self._queue.take(self.quantum, self._round(self._lightest()))
            self._plan_kind = kind
            self._plan.extend(self._batches(rows))

    def next_express(self) -> ForwardBatch | None:
        """While every slot is busy, a forward to run beside them now rather than after one of them,
        on the express threads (None when a slot is free or none may run). It is in flight like any
        forward but takes no slot: a slot it did not take frees as before. No window: the busy slots
        are the wait. First the lane express (R-BAT-6, `_lane_express`: up to `max_in_flight` of its
        forwards at once, as many as the slots), else, while no express forward runs, the lightest
        tenant's next turn (R-FAIR-7, `_tenant_express`: one at a time)."""
        if not self.busy or len(self._express) >= self.max_in_flight:
            return None
        batch = self._lane_express()
        if batch is not None:
            self._lane_express_running.append(batch)
        elif not self._express:
            batch = self._tenant_express()
        if batch is not None:
            self._express.append(batch)
            self._in_flight.append(batch)
        return batch

    def may_yield(self, batch: ForwardBatch) -> bool:
        """Whether BATCH, a slot's forward, may pause for lane express forwards (R-BAT-6): its lane
        costs more per token than the model's cheapest lane (the only lanes the express runs)."""
        cost = self.costs.seconds_per_token
        return len(self.lanes) > 1 and cost(batch.lane) > min(cost(lane) for lane in self.lanes)

    def yields_to(self, batch: ForwardBatch) -> bool:
        """Whether BATCH, running, is a lane express forward (R-BAT-6): the slots' forwards of the
        costlier lanes may pause for it (`adapters/lane_yield.py`)."""
        return any(batch is b for b in self._lane_express_running)

    @property
    def express_running(self) -> int:
        """Express forwards running now (`next_express`'s)."""
        return len(self._express)

    def _lane_express(self) -> ForwardBatch | None:
        """Rows of a lane that costs less per token than the lane of every forward in the slots
        (`lane_express.lane_express_forward`): the plan's next forward when it is of that lane, else
        one forward of that lane's queued rows in arrival order. Not a turn of the round robin: the
        rows leave the queue without their tenant's credit, and a cheaper lane is the rule, not a tenant."""
        if len(self.lanes) < 2:
            return None
        slots = [b for b in self._in_flight if not any(b is e for e in self._express)]
        taken = lane_express_forward(
            self._plan, self._queue, slots, self.costs.seconds_per_token, self._live, self._batches
        )
        if taken is None:
            return None
        batch, planned = taken
        if planned:
            self._ran(batch)
        return batch

    def _tenant_express(self) -> ForwardBatch | None:
        """R-FAIR-7 (`tenant_express.tenant_express_forward`): the rows of the tenant asking least when
        another tenant holding work asks more (queued and running tokens count), its next turn had
        early. None when it had that turn early already or a plan waits."""
        if self._plan:
            return None
        return tenant_express_forward(
            self._queue, self._in_flight, self.tenants.weight, self.quantum, self._round(), self._batches
        )

    def _cut_in(self, now: float) -> ForwardBatch | None:
        """While a whole-queue plan of one tenant's batch rows runs, that tenant's interactive
        rows queued since run in the next forward — one forward of them, then one of the plan's,
        alternately (R-FAIR-3): a small request waits at most one forward of its tenant's large
        one, and the large one at most one forward per forward of its own."""
        kind = self._plan_kind
        if not self._plan or kind is None or kind[1] is not Priority.BATCH or not self._may_cut_in:
            return None
        if (
            self._queue.single_kind() != (kind[0], Priority.INTERACTIVE)
            or self.window_state(now) is not WindowState.DUE
        ):
            return None
        rows = self._queue.take(self.quantum, self._round())  # one forward's worth, in arrival order
        batches = self._batches(rows)  # queued rows are of live requests (`cancel` removes them)
        if not batches:
            return None
        self._queue.restore(r for b in batches[1:] for r in b.rows)  # the rest waits its turn
        self._may_cut_in = False
        return batches[0]

    def _batches(self, rows: Sequence[Row]) -> tuple[ForwardBatch, ...]:
        """ROWS planned into forwards under the budget (R-BAT-3/4)."""
        return plan_forwards(
            rows,
            self.lanes,
            self.budget,
            self.costs,
            batch_invariant=self.batch_invariant,
            invariant_tokens=self.invariant_tokens,
        ).batches

    def _lightest(self) -> frozenset[str]:
        """While several tenants are backlogged, the one asking least for its weight (queued
        counted tokens ÷ weight; ties: all of them); nobody while one tenant is."""
        names = self._queue.tenants()
        if len(names) < 2:
            return frozenset()
        return least_asking({name: self._queue.tokens_of(name) for name in names}, names, self.tenants.weight)[0]

    def _round(self, light: frozenset[str] = frozenset()) -> Callable[[Row], bool]:
        """A fair round's room: at most one forward per lane (the first row of a lane always fits;
        one longer than the budget runs alone). LIGHT (`_lightest`): the round ends once every
        queued row of those tenants is in it, so the tenant asking least is answered by a forward
        holding what it asked and the turns the others had meanwhile, not a whole forward of
        theirs (R-FAIR-6)."""
        taken: dict[str, tuple[int, int, int]] = {}  # lane → (rows, widest counted row, counted tokens)
        light_left = sum(self._queue.rows_of(name) for name in light) if light else None

        def room(row: Row) -> bool:
            nonlocal light_left
            if light_left is not None and light_left <= 0:
                return False
            lane = self.lanes[row.lane]
            need = round_up(row.tokens)
            rows, width, packed = taken.get(row.lane, (0, 0, 0))
            if rows:
                limit = self._limit(lane)
                if lane.accounting is Accounting.PADDED:
                    fits = (rows + 1) * max(width, need) <= limit
                else:
                    fits = packed + need <= limit
                if rows >= self.budget.max_num_seqs or not fits:
                    return False
            taken[row.lane] = (rows + 1, max(width, need), packed + need)
            if light_left is not None and row.tenant in light:
                light_left -= 1
            return True

        return room

    def _live(self, batch: ForwardBatch) -> ForwardBatch | None:
        return self._without(batch, lambda r: r.request_id not in self._requests)

    @staticmethod
    def _without(batch: ForwardBatch, gone: Callable[[Row], bool]) -> ForwardBatch | None:
        """BATCH less the rows GONE says (None: no row left)."""
        rows = tuple(r for r in batch.rows if not gone(r))
        if not rows:
            return None
        if len(rows) == len(batch.rows):
            return batch
        return ForwardBatch(
            batch.lane, rows, forward_tokens((r.tokens for r in rows), batch.accounting), batch.accounting
        )

    # ---- apply ----------------------------------------------------------------------------
    def complete(self, batch: ForwardBatch, outputs: Sequence[Any], seconds: float | None = None) -> list[Answer]:
        """Record a forward's outputs; answer every request whose last row has now run."""
        self._release(batch)
        if len(outputs) != len(batch.rows):
            raise ValueError(f"engine returned {len(outputs)} outputs for {len(batch.rows)} rows")
        if seconds is not None:
            self.costs.observe(batch.lane, batch.tokens, seconds)
        answers: list[Answer] = []
        for row, out in zip(batch.rows, outputs):
            pending = self._requests.get(row.request_id)
            if pending is None:  # cancelled while its forward ran
                continue
            pending.outputs[row.index] = out
            pending.done += 1
            if pending.done == pending.rows:
                del self._requests[row.request_id]
                answers.append(Answer(row.request_id, tuple(pending.outputs)))
        return answers

    def fail(self, batch: ForwardBatch) -> list[int]:
        """A forward failed: fail exactly the requests that had rows in it."""
        self._release(batch)
        failed = [rid for rid in sorted(batch.request_ids) if rid in self._requests]
        for rid in failed:
            self.cancel(rid)
        return failed

    def _release(self, batch: ForwardBatch) -> None:
        self._express = [b for b in self._express if b is not batch]
        self._lane_express_running = [b for b in self._lane_express_running if b is not batch]
        for i, running in enumerate(self._in_flight):
            if running is batch:
                del self._in_flight[i]
                return
        raise ValueError("complete/fail must be given a forward that is in flight")
