"""The lane express (R-BAT-6): while every forward slot runs a forward of a costlier lane, rows
of a cheaper lane that queued run at once on express forwards (R-FAIR-7's extra forwards beside the
busy slots, up to one per slot) instead of waiting for a slot.

The rule is one comparison of costs per token (`domain/scheduling/costs.py`): the express may take the
cheapest lane waiting when it costs strictly less per token than the lane of every forward
running in a slot. No estimate of remaining time is needed: a cheaper lane's forward of the same
counted tokens is shorter by the ratio of the costs, and a forward of the cheaper lane is
planned within the same budget as any other (the cheap lane's rows of a round ride it, one
forward's worth). It never delays the costly lane's forwards in the slots (the express takes
no slot; a slot that frees runs the next plan as before), and it never changes an answer: the
same rows, planned by the same rules (`plan_forwards`: an exact row of a model that is not
batch-invariant still runs alone), on another thread. `lane_express_forward` takes one such forward out
of the scheduler's plan or queue (`Scheduler.next_express`), against the forwards in the slots (the
express forwards running do not count: the cheap lane may run as many at once as there are slots,
so two questions that must run alone run side by side, as they would on the slots).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence

from vllm_srun.domain.scheduling.fairness import FairQueue
from vllm_srun.domain.scheduling.planning import ForwardBatch
from vllm_srun.domain.scheduling.rows import Row


def express_lane(running: Iterable[str], waiting: Iterable[str], cost: Callable[[str], float]) -> str | None:
    """The lane whose rows may run on the express forward now: of the WAITING lanes, the
    cheapest per token (COST: seconds per token; ties by name), when it costs strictly less than
    every lane RUNNING in the slots. None when nothing runs, nothing waits, or a slot runs a
    forward of a lane as cheap (its rows then wait for a slot as before)."""
    running = set(running)
    waiting = sorted(set(waiting))
    if not running or not waiting:
        return None
    cheapest = min(waiting, key=lambda lane: (cost(lane), lane))
    floor = min(cost(lane) for lane in running)
    return cheapest if cost(cheapest) < floor else None


def rows_of_lane(rows: Iterable[Row], lane: str) -> dict[int, set[int]]:
    """The rows of LANE among ROWS, as request id → row indices (what `FairQueue.remove_request`
    takes)."""
    taken: dict[int, set[int]] = {}
    for row in rows:
        if row.lane == lane:
            taken.setdefault(row.request_id, set()).add(row.index)
    return taken


def lane_express_forward(
    plan: deque[ForwardBatch],
    queue: FairQueue,
    running: Iterable[ForwardBatch],
    cost: Callable[[str], float],
    live: Callable[[ForwardBatch], ForwardBatch | None],
    batches: Callable[[Sequence[Row]], tuple[ForwardBatch, ...]],
) -> tuple[ForwardBatch, bool] | None:
    """The lane express's forward, taken out of PLAN or QUEUE: rows of the lane `express_lane` picks
    among QUEUE's lanes and the lane of PLAN's next forward, against the lanes of the forwards RUNNING
    in the slots (COST: seconds per token). PLAN's next forward when it is of that lane (True: it left
    the plan), else one forward of that lane's queued rows in arrival order (BATCHES plans them; the
    rest goes back to QUEUE, in place; False). PLAN's dead heads (LIVE None) are dropped first. None
    when no lane may ride the express."""
    while plan and live(plan[0]) is None:
        plan.popleft()
    waiting = queue.lanes() | ({plan[0].lane} if plan else set())
    lane = express_lane((b.lane for b in running), waiting, cost)
    if lane is None:
        return None
    if plan and plan[0].lane == lane:
        batch = live(plan.popleft())
        assert batch is not None  # dead heads were dropped above
        return batch, True
    rows = [r for r in queue.rows() if r.lane == lane]
    for rid, indices in rows_of_lane(rows, lane).items():
        queue.remove_request(rid, indices)
    planned = batches(rows)
    queue.restore(r for b in planned[1:] for r in b.rows)
    return planned[0], False
