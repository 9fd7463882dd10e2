"""The lane express (R-BAT-6): while every forward slot runs a forward of a costlier lane, rows
of a cheaper lane that queued run at once on the express forward (R-FAIR-7's extra forward
beside the busy slots) instead of waiting for a slot.

The rule is one comparison of costs per token (`domain/scheduling/costs.py`): the express may take the
cheapest lane waiting when it costs strictly less per token than the lane of every forward
running in a slot. No estimate of remaining time is needed: a cheaper lane's forward of the same
counted tokens is shorter by the ratio of the costs, and a forward of the cheaper lane is
planned within the same budget as any other (the cheap lane's rows of a round ride it, one
forward's worth). It never delays the costly lane's forwards in the slots (the express takes
no slot; a slot that frees runs the next plan as before), and it never changes an answer: the
same rows, planned by the same rules (`plan_forwards`: an exact row of a model that is not
batch-invariant still runs alone), on another thread.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

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
