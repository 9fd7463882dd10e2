"""R-BAT-6 in the scheduler, case by case: a waiting plan gives way to rows of a cheaper lane that
arrive while it waits (they take the next forward), gives way again only after a forward of the
costlier lane has run (a stream of cheap rows never starves the costly lane), and never for rows
of a lane that costs as much."""

from __future__ import annotations

import itertools

from vllm_srun.domain.scheduling.costs import CostModel
from vllm_srun.domain.scheduling.lanes import Accounting, Lane
from vllm_srun.domain.scheduling.planning import Budget, ForwardBatch
from vllm_srun.domain.scheduling.rows import RowSpec
from vllm_srun.domain.scheduling.scheduler import Scheduler
from vllm_srun.domain.scheduling.tenants import TenantTable

NOW = 100.0
MEDIA = 32  # counted tokens of one media row: one row fills a forward of the budget below


def scheduler(text_cost: float = 1e-6, media_cost: float = 1e-4) -> Scheduler:
    costs = CostModel()
    costs.seed("text", text_cost)
    costs.seed("media", media_cost)
    return Scheduler(
        [Lane("text", Accounting.PACKED), Lane("media", Accounting.PACKED)],
        Budget(64, MEDIA),
        window_s=0.0,
        costs=costs,
        tenants=TenantTable(),
    )


def media(s: Scheduler, requests: int) -> set[int]:
    """REQUESTS image questions of one row each (each fits a forward: interactive)."""
    return {s.submit([RowSpec(MEDIA, i, "media")], NOW) for i in range(requests)}


def text(s: Scheduler) -> int:
    return s.submit([RowSpec(8, "t", "text")], NOW)


def run(s: Scheduler, batch: ForwardBatch) -> None:
    s.complete(batch, [r.payload for r in batch.rows])


def test_a_text_row_arriving_behind_a_media_plan_takes_the_next_forward() -> None:
    s = scheduler()
    images = media(s, 4)
    first = s.next_forward(NOW)
    assert first is not None and first.lane == "media"
    assert len(s.planned_forwards) == 3  # the rest of the round waits
    question = text(s)
    run(s, first)
    second = s.next_forward(NOW)
    assert second is not None and [r.request_id for r in second.rows] == [question]
    run(s, second)
    lanes = []
    while (batch := s.next_forward(NOW)) is not None:
        lanes.append(batch.lane)
        assert {r.request_id for r in batch.rows} <= images
        run(s, batch)
    assert lanes == ["media"] * 3  # every media row still runs once


def test_a_stream_of_text_rows_never_starves_the_media_lane() -> None:
    s = scheduler()
    media(s, 4)
    order = []
    batch = s.next_forward(NOW)
    while batch is not None:
        order.append(batch.lane)
        text(s)  # a text row arrives during every forward
        run(s, batch)
        batch = s.next_forward(NOW)
        if order.count("media") == 4:
            break
    assert order.count("media") == 4
    # between two media forwards, the text rows that queued meanwhile: never a media forward skipped twice
    media_at = [i for i, lane in enumerate(order) if lane == "media"]
    assert all(b - a <= 2 for a, b in itertools.pairwise(media_at)), order


def test_no_give_way_for_a_lane_of_equal_cost() -> None:
    s = scheduler(text_cost=1e-4, media_cost=1e-4)
    media(s, 3)
    first = s.next_forward(NOW)
    assert first is not None
    text(s)
    run(s, first)
    lanes = []
    while (batch := s.next_forward(NOW)) is not None:
        lanes.append(batch.lane)
        run(s, batch)
    assert lanes == ["media", "media", "text"]  # the plan ran as it was made
