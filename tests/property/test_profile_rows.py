"""R-PROF-2 as a property of the scheduler: a row of an exact request (its profile does not
coalesce) on a model that is not batch-invariant never shares a forward with any other row, in
every way a forward is made — whole-queue plans, fair rounds of several tenants, a tenant's
interactive rows cutting in ahead of its batch plan, express forwards beside busy slots — and every
request is still answered once. On a batch-invariant model exact rows merge like any others."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_srun.domain.scheduling.costs import CostModel
from vllm_srun.domain.scheduling.lanes import Accounting, Lane
from vllm_srun.domain.scheduling.planning import Budget, ForwardBatch, plan_forwards
from vllm_srun.domain.scheduling.rows import Row, RowSpec
from vllm_srun.domain.scheduling.scheduler import Scheduler
from vllm_srun.domain.scheduling.tenants import Priority, TenantPolicy, TenantTable

TENANTS = TenantTable({"a": TenantPolicy(weight=1.0), "b": TenantPolicy(weight=3.0)})

submit = st.tuples(
    st.just("submit"),
    st.sampled_from(["a", "b", "default"]),
    st.sampled_from([None, Priority.INTERACTIVE, Priority.BATCH]),
    st.booleans(),  # exact
    st.lists(st.integers(1, 120), min_size=1, max_size=5),
)
step = st.one_of(
    submit,
    st.tuples(st.just("advance"), st.sampled_from([0.0005, 0.002, 0.05])),
    st.tuples(st.just("start")),
    st.tuples(st.just("express")),
    st.tuples(st.just("finish"), st.integers(0, 10)),
)


@settings(max_examples=300, deadline=None)
@given(
    invariant=st.booleans(),
    packed=st.booleans(),
    max_in_flight=st.integers(1, 3),
    window_ms=st.sampled_from([0.0, 2.0]),
    steps=st.lists(step, max_size=60),
)
def test_an_exact_row_of_a_model_that_is_not_batch_invariant_runs_alone(
    invariant: bool, packed: bool, max_in_flight: int, window_ms: float, steps: list[tuple]
) -> None:
    lane = Lane("text", Accounting.PACKED if packed else Accounting.PADDED)
    scheduler = Scheduler(
        [lane],
        Budget(6, 256),
        window_s=window_ms / 1000,
        batch_invariant=invariant,
        max_in_flight=max_in_flight,
        tenants=TENANTS,
    )
    now = 0.0
    exact: set[int] = set()
    running: list[ForwardBatch] = []
    answered: set[int] = set()
    submitted: set[int] = set()
    merged_exact = False  # an exact row that shared a forward (allowed only on an invariant model)

    def check(batch: ForwardBatch | None) -> None:
        nonlocal merged_exact
        if batch is None:
            return
        has_exact = any(r.request_id in exact for r in batch.rows)
        if has_exact and len(batch.rows) > 1:
            merged_exact = True
            assert invariant, f"an exact row shared a forward of {len(batch.rows)} rows on a non-invariant model"
        running.append(batch)

    def finish(batch: ForwardBatch) -> None:
        for answer in scheduler.complete(batch, [None] * len(batch.rows)):
            assert answer.request_id not in answered
            answered.add(answer.request_id)

    for op in steps:
        if op[0] == "submit":
            _, tenant, priority, is_exact, lengths = op
            rid = scheduler.submit([RowSpec(n) for n in lengths], now, tenant=tenant, priority=priority, exact=is_exact)
            submitted.add(rid)
            if is_exact:
                exact.add(rid)
        elif op[0] == "advance":
            now += op[1]
        elif op[0] == "start":
            check(scheduler.next_forward(now))
        elif op[0] == "express":
            check(scheduler.next_express())
        elif running:
            finish(running.pop(op[1] % len(running)))
    while running:
        finish(running.pop())
    for _ in range(10_000):  # drain
        now += 1.0
        batch = scheduler.next_forward(now)
        if batch is None:
            break
        check(batch)
        finish(running.pop())
    assert answered == submitted, "a request was never answered"


def test_exact_rows_merge_on_a_batch_invariant_model_and_run_alone_otherwise() -> None:
    rows = [Row(request_id=i // 2, index=i % 2, tokens=10, lane="text", seq=i, exact=i < 4) for i in range(8)]
    lanes = {"text": Lane("text")}
    budget = Budget(16, 4096)
    merged = plan_forwards(rows, lanes, budget, CostModel(), batch_invariant=True)
    assert [len(b.rows) for b in merged.batches] == [8]
    apart = plan_forwards(rows, lanes, budget, CostModel(), batch_invariant=False)
    # the four exact rows (requests 0 and 1) alone, in arrival order, after the others' one forward
    assert [len(b.rows) for b in apart.batches] == [4, 1, 1, 1, 1]
    assert [b.rows[0].seq for b in apart.batches[1:]] == [0, 1, 2, 3]
