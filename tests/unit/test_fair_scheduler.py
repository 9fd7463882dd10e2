"""R-FAIR-2/3 in the scheduler, case by case: merged forwards mix tenants, a tenant's interactive
rows go before its batch rows, a waiting whole-queue plan is given back when another tenant
arrives, one tenant is planned exactly as before (the whole queue in one round), and a bad
`options.priority` is refused naming the field, a request larger than a forward that asked for no
priority runs as batch (a small one after it is not held up), and a light tenant beside a flood
rides a forward with the flood's turns meanwhile in it (R-FAIR-6), and while every slot is busy
that ride runs beside them as an express forward (R-FAIR-7)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from vllm_srun.adapters.http.request_body import decode_request
from vllm_srun.adapters.schemas.routes import SURFACE_SCHEMAS
from vllm_srun.domain.errors import InvalidRequest
from vllm_srun.domain.scheduling.fairness import FairQueue
from vllm_srun.domain.scheduling.lanes import Accounting, Lane
from vllm_srun.domain.scheduling.planning import Budget, ForwardBatch
from vllm_srun.domain.scheduling.rows import Row, RowSpec
from vllm_srun.domain.scheduling.scheduler import Scheduler
from vllm_srun.domain.scheduling.tenants import Priority, TenantPolicy, TenantTable

NOW = 100.0


def scheduler(max_tokens: int = 256, table: TenantTable | None = None, slots: int = 1) -> Scheduler:
    return Scheduler(
        [Lane("text", Accounting.PACKED)],
        Budget(64, max_tokens),
        window_s=0.0,
        tenants=table or TenantTable(),
        max_in_flight=slots,
    )


def specs(*lengths: int) -> list[RowSpec]:
    return [RowSpec(n, n) for n in lengths]


def run(s: Scheduler, batch: ForwardBatch) -> list[int]:
    answered = s.complete(batch, [r.payload for r in batch.rows])
    return [a.request_id for a in answered]


def test_a_merged_forward_holds_rows_of_several_tenants() -> None:
    s = scheduler()
    a = s.submit(specs(8, 8), NOW, tenant="a")
    b = s.submit(specs(8), NOW, tenant="b")
    batch = s.next_forward(NOW)
    assert batch is not None and {r.tenant for r in batch.rows} == {"a", "b"}
    assert sorted(run(s, batch)) == [a, b]


def test_interactive_rows_of_a_tenant_go_before_its_batch_rows() -> None:
    s = scheduler(max_tokens=64)
    late = [s.submit(specs(32), NOW, priority=Priority.BATCH) for _ in range(4)]
    urgent = s.submit(specs(32, 32), NOW, priority=Priority.INTERACTIVE)
    first = s.next_forward(NOW)
    assert first is not None and [r.request_id for r in first.rows] == [urgent, urgent]
    assert run(s, first) == [urgent]
    order = []
    while (batch := s.next_forward(NOW)) is not None:
        order += run(s, batch)
    assert order == late


def test_a_request_larger_than_a_forward_runs_as_batch_unless_it_asks() -> None:
    s = scheduler(max_tokens=64)
    assert s.automatic_priority(specs(32, 32)) is Priority.INTERACTIVE  # one forward's worth
    assert s.automatic_priority(specs(32, 32, 8)) is Priority.BATCH  # more tokens than a forward
    assert s.automatic_priority(specs(*[1] * 65)) is Priority.BATCH  # more rows than max_num_seqs


def test_a_small_request_is_not_held_up_by_its_tenants_large_one() -> None:
    """The hostile case of tests/hostile/test_1_cpu_work.py: a request of many forwards, then a small
    one of the same tenant; neither asked for a priority. The small one runs in the next forward."""
    s = scheduler(max_tokens=64)
    large = s.submit(specs(*[32] * 16), NOW)  # 8 forwards' worth
    first = s.next_forward(NOW)
    assert first is not None and {r.request_id for r in first.rows} == {large}
    small = s.submit(specs(16), NOW)
    run(s, first)
    second = s.next_forward(NOW)
    assert second is not None and second.rows[0].request_id == small
    asked = s.submit(specs(*[32] * 4), NOW, priority=Priority.INTERACTIVE)  # asked: honoured
    queued = [*s.unplanned_rows, *(r for b in s.planned_forwards for r in b.rows)]
    assert [r.priority for r in queued if r.request_id == asked] == [Priority.INTERACTIVE] * 4
    assert {r.priority for r in queued if r.request_id == large} == {Priority.BATCH}


def test_a_waiting_plan_of_one_tenant_is_given_back_when_another_arrives() -> None:
    s = scheduler(max_tokens=64, table=TenantTable({"flood": TenantPolicy(weight=1.0)}))
    for _ in range(40):
        s.submit(specs(32, 32), NOW, tenant="flood")
    first = s.next_forward(NOW)  # one tenant: the whole queue is planned at once, as before
    assert first is not None and len(s.planned_forwards) == 39 and not s.unplanned_rows
    steady = s.submit(specs(16), NOW, tenant="steady")
    assert not s.planned_forwards  # given back: the next rounds share the device
    run(s, first)
    taken: list[str] = []
    answered: list[int] = []
    for _ in range(3):
        batch = s.next_forward(NOW)
        assert batch is not None
        taken += [r.tenant for r in batch.rows]
        answered += run(s, batch)
    assert steady in answered, taken


def test_the_lightest_tenant_rides_a_short_forward_beside_a_flood() -> None:
    """R-FAIR-6: beside a flood, the tenant asking least is answered by a forward holding its rows
    and the flood's turns meanwhile (quantum 32: one turn for 8 tokens, two for 48), not a whole
    forward of the flood, whose rest runs right after; two floods fill their forwards as before."""
    s = scheduler(max_tokens=256)
    assert s.quantum == 32
    flood = [s.submit(specs(16), NOW, tenant="a") for _ in range(20)]  # 320 tokens queued
    light = s.submit(specs(8), NOW, tenant="b")
    first = s.next_forward(NOW)
    assert first is not None and light in first.request_ids
    assert sum(16 for r in first.rows if r.tenant == "a") <= s.quantum  # one turn of a
    answered = run(s, first)
    assert light in answered
    second = s.next_forward(NOW)
    assert second is not None and {r.tenant for r in second.rows} == {"a"} and len(second.rows) == 16  # full
    while True:
        answered += run(s, second)
        if (second := s.next_forward(NOW)) is None:
            break
    assert sorted(answered) == sorted([*flood, light])

    s = scheduler(max_tokens=256)
    for _ in range(20):
        s.submit(specs(16), NOW, tenant="a")
    three = s.submit(specs(16, 16, 16), NOW, tenant="b")  # 48 tokens: two turns of b
    batch = s.next_forward(NOW)
    assert batch is not None and [r.request_id for r in batch.rows if r.tenant == "b"] == [three] * 3
    assert batch.tokens == 48 + 2 * s.quantum  # and two turns of a

    s = scheduler(max_tokens=256)
    for tenant in ("a", "b"):
        for _ in range(20):
            s.submit(specs(16), NOW, tenant=tenant)
    full = s.next_forward(NOW)
    assert full is not None and full.tokens == 256  # equal floods: a full forward, half each
    assert sum(r.tenant == "a" for r in full.rows) == 8


def test_one_tenant_one_priority_plans_the_whole_queue_in_one_round() -> None:
    for priority in Priority:
        s = scheduler(max_tokens=64)
        for _ in range(10):
            s.submit(specs(32, 32), NOW, tenant="only", priority=priority)
        assert s.next_forward(NOW) is not None
        assert len(s.planned_forwards) == 9 and not s.unplanned_rows


def test_a_bad_priority_is_refused_naming_the_field() -> None:
    for schema in SURFACE_SCHEMAS:
        if schema.path not in ("/v1/embeddings", "/v1/classify"):
            continue
        good = decode_request(schema.decoder, b'{"input": "hi", "options": {"priority": "batch"}}', None, 10_000)
        assert good.options.priority is Priority.BATCH
        with pytest.raises(InvalidRequest, match=r"options\.priority"):
            decode_request(schema.decoder, b'{"input": "hi", "options": {"priority": "urgent"}}', None, 10_000)


def test_while_every_slot_is_busy_the_lightest_tenant_rides_an_express_forward() -> None:
    """R-FAIR-7: two slots busy with a flood's forwards; a light tenant's request gets a forward at
    once, of its rows alone (its next turn, had early), one at a time, taking no slot: a slot that
    frees runs the flood again while it runs, and every row is answered once."""
    s = scheduler(max_tokens=256, slots=2)
    flood = [s.submit(specs(16), NOW, tenant="a") for _ in range(60)]
    busy = [s.next_forward(NOW), s.next_forward(NOW)]
    assert all(b is not None for b in busy) and s.busy and s.next_forward(NOW) is None
    assert s.next_express() is None  # one tenant backlogged: nobody to hurry
    light = s.submit(specs(8), NOW, tenant="b")
    express = s.next_express()
    assert express is not None and light in express.request_ids
    assert {r.tenant for r in express.rows} == {"b"}  # none of the flood's rows in it
    late = s.submit(specs(8), NOW, tenant="b")
    assert s.next_express() is None  # one express forward at a time
    assert s.in_flight == 3 and s.busy
    answered = run(s, busy[0])  # a slot frees while the express forward runs
    refill = s.next_forward(NOW)
    assert refill is not None and late in refill.request_ids  # b is still the lightest: its round
    assert s.busy
    answered += run(s, express)
    assert light in answered
    for batch in (busy[1], refill):
        assert batch is not None
        answered += run(s, batch)
    while (batch := s.next_forward(NOW)) is not None:
        answered += run(s, batch)
    assert sorted(answered) == sorted([*flood, light, late])


def test_no_express_forward_with_a_free_slot() -> None:
    s = scheduler(max_tokens=256, slots=2)
    for _ in range(10):
        s.submit(specs(16), NOW, tenant="a")
    first = s.next_forward(NOW)
    assert first is not None and not s.busy  # the other slot is free
    s.submit(specs(8), NOW, tenant="b")
    assert s.next_express() is None
    second = s.next_forward(NOW)
    assert second is not None and "b" in {r.tenant for r in second.rows}


def test_the_express_forward_serves_a_light_tenant_while_the_flood_is_all_running() -> None:
    """R-FAIR-7: the flood's rows are all in the two busy slots, none queued; a light tenant's
    request still rides an express forward (running rows count in who asks least), and a tenant
    asking as much as the others gets none (nobody asks more)."""
    s = scheduler(max_tokens=256, slots=2)
    flood = [s.submit(specs(16), NOW, tenant="a") for _ in range(20)]  # 320 tokens: two forwards
    busy = [s.next_forward(NOW), s.next_forward(NOW)]
    assert all(b is not None for b in busy) and s.busy and not s.unplanned_rows
    light = s.submit(specs(8), NOW, tenant="b")
    express = s.next_express()
    assert express is not None and express.request_ids == frozenset({light})
    answered = run(s, express)
    for batch in busy:
        assert batch is not None
        answered += run(s, batch)
    assert sorted(answered) == sorted([*flood, light])
    even = scheduler(max_tokens=64, slots=2)
    for tenant in ("a", "b"):
        even.submit(specs(32, 32, 32), NOW, tenant=tenant)
    assert even.next_forward(NOW) is not None and even.next_forward(NOW) is not None and even.busy
    assert even.unplanned_rows  # rows wait, but a and b ask the same (queued and running): nobody to hurry
    assert even.next_express() is None


def test_a_turn_had_early_is_not_had_again_at_its_place_in_the_ring() -> None:
    """FairQueue.take_ahead: a tenant has its next turn early, once; its next place in the ring
    gives it nothing, so over the ring the tenants still have a turn each."""
    table = TenantTable()
    queue = FairQueue(table.weight)
    for seq in range(12):
        queue.push(Row(seq, 0, 8, "text", seq, None, "a" if seq < 6 else "b", Priority.INTERACTIVE))
    early = queue.take_ahead(frozenset({"b"}), 8.0, lambda row: True)
    assert [r.tenant for r in early] == ["b"] and queue.ahead("b") == 1
    assert queue.take_ahead(frozenset({"b"}), 8.0, lambda row: True) == []  # not twice
    ring = queue.take(8.0, _rows(5))
    assert [r.tenant for r in ring] == ["a", "a", "b", "a", "b"]  # b's place after a gave nothing
    assert queue.ahead("b") == 0
    assert [r.tenant for r in queue.take_ahead(frozenset({"b"}), 8.0, lambda row: True)] == ["b"]


def _rows(count: int) -> Callable[[Row], bool]:
    left = [count]

    def room(row: Row) -> bool:
        left[0] -= 1
        return left[0] >= 0

    return room
