"""Stateful property tests of the scheduler against a FakeForward and a FakeClock (R-BAT-8).

Rules submit requests (several lanes, any lengths), cancel them, expire some or all of their rows
(a deadline, R-API-10), advance the clock and run or fail forwards. Invariants are checked after
every step against a simple model of what was asked for: every row planned exactly once (or, past
its deadline before it started, never, answering EXPIRED in its place), budgets, token counts,
lanes, exactly-once answers in input order, the window, and cancelled rows never reaching the
engine.

Forwards start and end in separate steps, in any order, up to `max_in_flight` at once (a CPU
worker's concurrent forwards): never more run at once, and a row is never in two of them.

Three lanes as the multimodal and audio families have them (R-BAT-6): `text`, `media` and
`audio`, each with its own accounting and cap, and a different device cost per token (media and
audio rows cost far more than text, and differently from each other). The
scheduler learns each lane's cost from its own forwards, and every planning round runs the
lane it estimates cheaper first, each lane's forwards together.

Requests are exact or not at random (R-PROF-2): an exact request's rows on a model that is not
batch-invariant never share a forward with any other row, while a batch-invariant model's merge
as any others.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tests.fakes import EngineFailure, FakeClock, FakeForward
from vllm_srun.domain.scheduling.answers import EXPIRED
from vllm_srun.domain.scheduling.lanes import Accounting, Lane, forward_tokens, round_up
from vllm_srun.domain.scheduling.planning import Budget, ForwardBatch, lane_token_limit
from vllm_srun.domain.scheduling.rows import RowSpec
from vllm_srun.domain.scheduling.scheduler import Scheduler

LANES = ("text", "media", "audio")
COST = {"text": 1e-5, "media": 4e-4, "audio": 1.5e-4}  # device seconds per counted token of each lane


class SchedulerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.engine = FakeForward(clock=self.clock)
        self.scheduler: Scheduler | None = None

    @rule(
        max_seqs=st.integers(1, 9),
        max_tokens=st.sampled_from([8, 16, 64, 256, 1024]),
        window_ms=st.sampled_from([0.0, 1.0, 2.0, 50.0]),
        packed=st.booleans(),
        media_packed=st.booleans(),
        cap=st.sampled_from([None, 32, 128]),
        media_cap=st.sampled_from([None, 64]),
        audio_cap=st.sampled_from([None, 96, 512]),
        invariant_model=st.booleans(),
        invariant_tokens=st.sampled_from([512, 265, 48]),
        max_in_flight=st.integers(1, 3),
    )
    @precondition(lambda self: self.scheduler is None)
    def configure(
        self,
        max_seqs,
        max_tokens,
        window_ms,
        packed,
        media_packed,
        cap,
        media_cap,
        audio_cap,
        invariant_model,
        invariant_tokens,
        max_in_flight,
    ) -> None:  # type: ignore[no-untyped-def]
        accounting = Accounting.PACKED if packed else Accounting.PADDED
        media_accounting = Accounting.PACKED if media_packed else Accounting.PADDED
        self.lanes = [
            Lane("text", accounting, cap_tokens=cap),
            Lane("media", media_accounting, cap_tokens=media_cap),
            Lane("audio", Accounting.PADDED, cap_tokens=audio_cap),  # the audio family's lane: every row one window
        ]
        self.budget = Budget(max_seqs, max_tokens)
        self.window_s = 0.0 if invariant_model else window_ms / 1000
        self.scheduler = Scheduler(
            self.lanes,
            self.budget,
            window_s=window_ms / 1000,
            batch_invariant=invariant_model,
            invariant_tokens=invariant_tokens,
            max_in_flight=max_in_flight,
        )
        self.running: list[ForwardBatch] = []  # handed out, not completed yet
        self.submitted: dict[int, list[RowSpec]] = {}
        self.numbers: dict[int, int] = {}
        self.arrival: dict[int, float] = {}
        self.cancelled: set[int] = set()
        self.failed: set[int] = set()
        self.answered: dict[int, tuple] = {}
        self.ran: list[tuple[int, int]] = []  # (rid, index) of every row the engine saw
        self.expired: set[tuple[int, int]] = set()  # (rid, index) of every row given up at its deadline
        self.exact: set[int] = set()  # requests submitted exact (R-PROF-2)
        self.last_plan_round_rows: set[tuple[int, int]] = set()

    @precondition(lambda self: self.scheduler is not None)
    @rule(lengths=st.lists(st.integers(1, 300), min_size=1, max_size=6), lanes=st.data(), exact=st.booleans())
    def submit(self, lengths, lanes, exact) -> None:  # type: ignore[no-untyped-def]
        lane_names = [lanes.draw(st.sampled_from(LANES)) for _ in lengths]
        number = len(self.submitted)  # the request ids are the scheduler's; payloads carry ours
        specs = [RowSpec(n, (number, i), lane) for i, (lane, n) in enumerate(zip(lane_names, lengths))]
        rid = self.scheduler.submit(specs, self.clock.now(), exact=exact)
        if exact:
            self.exact.add(rid)
        self.submitted[rid] = specs
        self.numbers[rid] = number
        self.arrival[rid] = self.clock.now()

    @precondition(lambda self: self.scheduler is not None and self._open())
    @rule(data=st.data())
    def cancel(self, data) -> None:  # type: ignore[no-untyped-def]
        rid = data.draw(st.sampled_from(sorted(self._open())))
        assert self.scheduler.cancel(rid)
        self.cancelled.add(rid)

    @precondition(lambda self: self.scheduler is not None and self._open())
    @rule(data=st.data())
    def expire(self, data) -> None:  # type: ignore[no-untyped-def]
        rid = data.draw(st.sampled_from(sorted(self._open())))
        n = len(self.submitted[rid])
        indices = data.draw(st.one_of(st.none(), st.sets(st.integers(0, n - 1), min_size=1)))
        running = {(r.request_id, r.index) for b in self.running for r in b.rows}
        due = {(rid, i) for i in (range(n) if indices is None else indices)}
        given_up = due - running - set(self.ran) - self.expired  # queued or planned: never started
        answer = self.scheduler.expire(rid, indices)
        self.expired |= given_up
        left = {(rid, i) for i in range(n)} - self.expired - set(self.ran)
        if answer is None:
            assert left, "nothing of the request is left to run, yet it was not answered"
            return
        assert not left and answer.request_id == rid, "answered while a row of it still runs"
        self._record(answer)

    @precondition(lambda self: self.scheduler is not None)
    @rule(ms=st.sampled_from([0.1, 0.5, 1.0, 2.0, 10.0, 100.0]))
    def advance(self, ms: float) -> None:
        self.clock.advance(ms / 1000)

    @precondition(lambda self: self.scheduler is not None)
    @rule()
    def start(self) -> None:
        now = self.clock.now()
        state_before = self.scheduler.window_state(now)
        had_plan = bool(self.scheduler.planned_forwards)
        queued = self.scheduler.unplanned_rows
        oldest = min((self.arrival[r.request_id] for r in queued), default=None)
        full = bool(queued) and self._fills_a_forward(queued)
        slots_full = len(self.running) >= self.scheduler.max_in_flight
        batch = self.scheduler.next_forward(now)
        if batch is None:
            return
        assert not slots_full, "a forward handed out while every slot was taken"
        if not had_plan:
            # a new plan: only when the window closed (or the queue fills a forward)
            assert oldest is not None
            assert full or now >= oldest + self.window_s, (now, oldest, self.window_s, state_before)
        self._check_batch(batch)
        if not had_plan:
            self._check_round([batch, *self.scheduler.planned_forwards])  # the whole round just planned
        self.running.append(batch)
        assert self.scheduler.in_flight == len(self.running) <= self.scheduler.max_in_flight

    @precondition(lambda self: self.scheduler is not None and self.running)
    @rule(fail=st.booleans(), data=st.data())
    def finish(self, fail: bool, data) -> None:  # type: ignore[no-untyped-def]
        batch = self.running.pop(data.draw(st.integers(0, len(self.running) - 1)))  # any order
        self.engine.fail_next = 1 if fail else 0
        try:
            outputs = self.engine.run(batch.lane, [r.payload for r in batch.rows])
        except EngineFailure:
            for rid in self.scheduler.fail(batch):
                self.failed.add(rid)
            self.ran.extend((r.request_id, r.index) for r in batch.rows)
            return
        self.ran.extend((r.request_id, r.index) for r in batch.rows)
        self._complete(batch, outputs, COST[batch.lane] * batch.tokens)

    def _complete(self, batch, outputs, seconds=None) -> None:  # type: ignore[no-untyped-def]
        for answer in self.scheduler.complete(batch, outputs, seconds):
            self._record(answer)

    def _record(self, answer) -> None:  # type: ignore[no-untyped-def]
        rid = answer.request_id
        assert rid not in self.answered, "answered twice"
        assert rid not in self.cancelled and rid not in self.failed
        self.answered[rid] = answer.outputs
        expected = tuple(
            EXPIRED if (rid, i) in self.expired else (self.numbers[rid], i) for i in range(len(self.submitted[rid]))
        )
        assert answer.outputs == expected, "rows out of input order (or an expired row not EXPIRED)"

    def _fills_a_forward(self, queued) -> bool:  # type: ignore[no-untyped-def]
        """The queued rows fill a forward: as many as it may hold, or tokens up to any lane's limit."""
        limit = min(
            lane_token_limit(
                lane, self.budget, self.scheduler.costs, self.scheduler.batch_invariant, self.scheduler.invariant_tokens
            )
            for lane in self.lanes
        )
        return len(queued) >= self.budget.max_num_seqs or sum(round_up(r.tokens) for r in queued) >= limit

    def _check_batch(self, batch) -> None:  # type: ignore[no-untyped-def]
        if not self.scheduler.batch_invariant and any(r.request_id in self.exact for r in batch.rows):
            assert len(batch.rows) == 1, "an exact row shared a forward of a model that is not batch-invariant"
        lanes = {r.lane for r in batch.rows}
        assert lanes == {batch.lane}, "lanes mixed in one forward"
        lane = next(candidate for candidate in self.lanes if candidate.name == batch.lane)
        assert batch.tokens == forward_tokens((r.tokens for r in batch.rows), lane.accounting)
        if lane.accounting is Accounting.PADDED:
            assert batch.tokens == len(batch.rows) * round_up(max(r.tokens for r in batch.rows))
        assert len(batch.rows) <= self.budget.max_num_seqs
        limit = lane_token_limit(
            lane, self.budget, self.scheduler.costs, self.scheduler.batch_invariant, self.scheduler.invariant_tokens
        )
        if self.scheduler.batch_invariant:  # R-BAT-5: an exact model's merged forwards stay within its cap
            limit = min(limit, self.scheduler.invariant_tokens)
        if len(batch.rows) > 1:
            assert batch.tokens <= limit, "forward over the token budget"
        running = {(r.request_id, r.index) for b in self.running for r in b.rows}
        for r in batch.rows:
            assert r.request_id not in self.cancelled, "a cancelled row reached the engine"
            assert (r.request_id, r.index) not in self.expired, "a row past its deadline reached the engine"
            assert (r.request_id, r.index) not in self.ran, "a row ran twice"
            assert (r.request_id, r.index) not in running, "a row in two forwards at once"

    def _check_round(self, plan: list[ForwardBatch]) -> None:
        """One planning round: each lane's forwards together, the cheaper lane's first."""
        order = [b.lane for b in plan]
        lanes = list(dict.fromkeys(order))
        assert order == sorted(order, key=lanes.index), "a lane's forwards are split by another lane's"
        costs = self.scheduler.costs
        estimates = [costs.estimate(lane, sum(b.tokens for b in plan if b.lane == lane)) for lane in lanes]
        assert [(e, lane) for e, lane in zip(estimates, lanes)] == sorted(zip(estimates, lanes)), "costlier lane first"

    @invariant()
    def each_lane_keeps_its_own_cost(self) -> None:
        if self.scheduler is None:
            return
        for lane in LANES:
            if self.scheduler.costs.samples(lane):
                assert abs(self.scheduler.costs.seconds_per_token(lane) - COST[lane]) <= 1e-12

    def _open(self) -> set[int]:
        return set(self.submitted) - set(self.answered) - self.cancelled - self.failed

    @invariant()
    def accounting_adds_up(self) -> None:
        if self.scheduler is None:
            return
        assert self.scheduler.pending_requests == len(self._open())

    def teardown(self) -> None:
        if self.scheduler is None:
            return
        # drain: end the running forwards, advance past every window and run everything left
        while self.running:
            batch = self.running.pop()
            outputs = self.engine.run(batch.lane, [r.payload for r in batch.rows])
            self.ran.extend((r.request_id, r.index) for r in batch.rows)
            self._complete(batch, outputs)
        for _ in range(10_000):
            self.clock.advance(1.0)
            batch = self.scheduler.next_forward(self.clock.now())
            if batch is None:
                break
            self._check_batch(batch)
            outputs = self.engine.run(batch.lane, [r.payload for r in batch.rows])
            self.ran.extend((r.request_id, r.index) for r in batch.rows)
            for answer in self.scheduler.complete(batch, outputs):
                self._record(answer)
        assert self._open() == set(), "a request was never answered"
        live = set(self.answered)
        for rid in live:
            for i in range(len(self.submitted[rid])):
                once = 0 if (rid, i) in self.expired else 1
                assert self.ran.count((rid, i)) == once, "every row planned exactly once (an expired one never)"


SchedulerMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestScheduler = SchedulerMachine.TestCase
