"""R-BAT-6's lane express, case by case: while every slot runs a forward of a costlier lane, rows of
a cheaper lane that queued are handed out at once on express forwards (as many at once as there are
slots), as the plan's next forward or one forward of the queued rows; never while a slot is free or
runs a lane as cheap, never a costlier lane's rows; exact rows still run alone."""

from __future__ import annotations

from vllm_srun.domain.scheduling.costs import CostModel
from vllm_srun.domain.scheduling.lane_express import express_lane, rows_of_lane
from vllm_srun.domain.scheduling.lanes import Accounting, Lane
from vllm_srun.domain.scheduling.planning import Budget, ForwardBatch
from vllm_srun.domain.scheduling.rows import Row, RowSpec
from vllm_srun.domain.scheduling.scheduler import Scheduler
from vllm_srun.domain.scheduling.tenants import TenantTable

NOW = 100.0
MEDIA = 32  # counted tokens of one media row: one row fills a forward of the budget below
COST = {"text": 1e-6, "shared": 2e-6, "media": 1e-4}


def scheduler(slots: int = 2, *, exact_lanes: bool = False) -> Scheduler:
    costs = CostModel()
    for lane, cost in COST.items():
        costs.seed(lane, cost)
    return Scheduler(
        [Lane("text", Accounting.PACKED), Lane("shared", Accounting.PACKED), Lane("media", Accounting.PACKED)],
        Budget(64, MEDIA),
        window_s=0.0,
        costs=costs,
        max_in_flight=slots,
        tenants=TenantTable(),
    )


def fill_slots(s: Scheduler, images: int = 6) -> list[ForwardBatch]:
    for i in range(images):
        s.submit([RowSpec(MEDIA, ("m", i), "media")], NOW)
    running = []
    while (batch := s.next_forward(NOW)) is not None:
        running.append(batch)
    assert s.busy and all(b.lane == "media" for b in running)
    return running


def run(s: Scheduler, batch: ForwardBatch) -> list[int]:
    return [a.request_id for a in s.complete(batch, [r.payload for r in batch.rows])]


def test_the_rule_takes_the_cheapest_waiting_lane_below_every_running_one() -> None:
    cost = COST.__getitem__
    assert express_lane(["media", "media"], ["text", "shared"], cost) == "text"
    assert express_lane(["media"], ["shared"], cost) == "shared"
    assert express_lane(["media", "text"], ["text"], cost) is None  # a slot runs a lane as cheap
    assert express_lane(["shared"], ["media"], cost) is None  # never a costlier lane
    assert express_lane([], ["text"], cost) is None
    assert express_lane(["media"], [], cost) is None
    rows = [Row(1, 0, 8, "text", 0, None), Row(1, 1, 8, "media", 1, None), Row(2, 0, 8, "text", 2, None)]
    assert rows_of_lane(rows, "text") == {1: {0}, 2: {0}}


def test_a_text_row_rides_the_express_while_image_forwards_hold_every_slot() -> None:
    s = scheduler()
    running = fill_slots(s)
    question = s.submit([RowSpec(8, "t", "text")], NOW)
    express = s.next_express()
    assert express is not None and [r.request_id for r in express.rows] == [question]
    assert s.next_express() is None  # nothing else of a cheaper lane waits
    assert s.next_forward(NOW) is None  # it took no slot, and no slot is free
    assert run(s, express) == [question]
    planned = len(s.planned_forwards)
    assert run(s, running[0]) and s.next_forward(NOW) is not None  # the image lane goes on
    assert len(s.planned_forwards) == planned - 1


def test_no_lane_express_with_a_free_slot_or_a_slot_running_a_lane_as_cheap() -> None:
    s = scheduler()
    s.submit([RowSpec(MEDIA, "m", "media")], NOW)
    assert s.next_forward(NOW) is not None and not s.busy
    s.submit([RowSpec(8, "t", "text")], NOW)
    assert s.next_express() is None  # a slot is free: the text row takes it
    text = s.next_forward(NOW)
    assert text is not None and text.lane == "text" and s.busy
    s.submit([RowSpec(8, "t2", "text")], NOW)
    assert s.next_express() is None  # a slot runs the text lane: no cheaper lane waits


def test_the_plans_next_forward_of_a_cheaper_lane_rides_the_express() -> None:
    """A round whose text lane is estimated longer in all than its image forward plans the image
    forward first (`plan_forwards` orders lanes by estimated seconds); once it holds the slot, the
    plan's text forwards need not wait for it."""
    s = scheduler(slots=1)
    s.costs.seed("text", 5e-5)  # dearer than before, still cheaper per token than media
    texts = [s.submit([RowSpec(MEDIA, ("t", i), "text")], NOW) for i in range(3)]
    s.submit([RowSpec(MEDIA, "m", "media")], NOW)
    slot = s.next_forward(NOW)
    assert slot is not None and slot.lane == "media"
    express = s.next_express()
    assert express is not None and express.lane == "text" and express.rows[0].request_id == texts[0]
    assert [b.lane for b in s.planned_forwards] == ["text", "text"]


def test_exact_text_rows_still_run_alone_one_express_forward_each_as_many_at_once_as_slots() -> None:
    """Two questions of an exact request on a model that is not batch-invariant: two forwards of one
    row, side by side on the two express threads (as they would be on the two slots), not one
    after the other; a third waits for one of them."""
    s = scheduler()
    running = fill_slots(s)
    rid = s.submit([RowSpec(8, "q0", "text"), RowSpec(8, "q1", "text")], NOW, exact=True)
    later = s.submit([RowSpec(8, "q2", "text")], NOW, exact=True)
    first, second = s.next_express(), s.next_express()
    assert first is not None and second is not None
    assert [(r.request_id, r.index) for b in (first, second) for r in b.rows] == [(rid, 0), (rid, 1)]
    assert s.express_running == 2 and s.next_express() is None  # one per slot
    assert s.next_forward(NOW) is None  # the slots are still the image forwards'
    assert run(s, first) == [] and run(s, second) == [rid]
    third = s.next_express()
    assert third is not None and [r.request_id for r in third.rows] == [later]
    assert run(s, third) == [later]
    for batch in running:
        run(s, batch)


def test_merged_text_rows_ride_one_express_forward_and_the_rest_stays_queued() -> None:
    s = scheduler()
    fill_slots(s)
    ids = [s.submit([RowSpec(16, i, "text")], NOW) for i in range(3)]  # 48 counted tokens: 2 forwards of 32
    express = s.next_express()
    assert express is not None and [r.request_id for r in express.rows] == ids[:2]
    assert [r.request_id for r in s.unplanned_rows] == ids[2:]
    rest = s.next_express()
    assert rest is not None and [r.request_id for r in rest.rows] == ids[2:] and not s.unplanned_rows


def test_a_tenant_express_runs_only_while_no_express_forward_does() -> None:
    """R-FAIR-7's tenant express stays one at a time, and never beside a lane express: only the lane
    express runs up to one forward per slot."""
    s = scheduler()
    fill_slots(s, images=2)
    s.submit([RowSpec(8, "t", "text")], NOW)
    lane = s.next_express()
    assert lane is not None and lane.lane == "text" and s.yields_to(lane)
    s.submit([RowSpec(MEDIA, "light", "media")], NOW, tenant="light")
    s.submit([RowSpec(MEDIA, ("m", 9), "media")], NOW)
    assert s.next_express() is None  # a lane express runs: no tenant express beside it
    assert run(s, lane)
    tenant = s.next_express()
    assert tenant is not None and tenant.lane == "media" and tenant.rows[0].tenant == "light"
    assert not s.yields_to(tenant)  # the slots yield to a cheaper lane only (R-BAT-6), not to a tenant
    assert s.may_yield(tenant) and not s.may_yield(lane)  # a text forward in a slot never pauses
    assert s.next_express() is None  # one tenant express at a time


def test_a_cancelled_plan_head_is_skipped() -> None:
    s = scheduler(slots=1)
    s.costs.seed("text", 5e-5)
    gone = s.submit([RowSpec(MEDIA, "t0", "text")], NOW)
    kept = s.submit([RowSpec(MEDIA, "t1", "text")], NOW)
    s.submit([RowSpec(MEDIA, "t2", "text")], NOW)
    s.submit([RowSpec(MEDIA, "m", "media")], NOW)
    slot = s.next_forward(NOW)
    assert slot is not None and slot.lane == "media"
    s.cancel(gone)
    express = s.next_express()
    assert express is not None and express.rows[0].request_id == kept
