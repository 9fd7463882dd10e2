"""R-BAT-6's lane express as a property: two slots and up to two express forwards, any arrival
pattern of text and image requests (text cheaper per token; exact or not) and any order in which
running forwards end: every request is answered exactly once; whenever fewer express forwards run
than there are slots and every slot runs an image forward, no text row waits (it is on an express
forward); never more express forwards than slots; the express only ever runs a lane cheaper than
every slot's; and a steady stream of text requests never starves the image lane (every image
request is answered while text keeps arriving)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.test_lane_express import COST, MEDIA, NOW, scheduler
from vllm_srun.domain.scheduling.planning import ForwardBatch
from vllm_srun.domain.scheduling.rows import RowSpec
from vllm_srun.domain.scheduling.scheduler import Scheduler

# each step: (text requests, image requests, exact, which running forward ends)
steps = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 3), st.booleans(), st.integers(0, 5)), min_size=1, max_size=30
)


class Driver:
    """Hands out forwards as the scheduler loop does: slots first, then the express."""

    def __init__(self, s: Scheduler) -> None:
        self.s = s
        self.slots: list[ForwardBatch] = []
        self.express: list[ForwardBatch] = []
        self.answered: list[int] = []
        self.ran_rows: list[tuple[int, int]] = []
        self.started: dict[int, int] = {}  # id of a running forward → the step it started at
        self.step = 0

    def hand_out(self) -> None:
        while (batch := self.s.next_forward(NOW)) is not None:
            self.slots.append(batch)
        while (batch := self.s.next_express()) is not None:
            assert all(COST[batch.lane] < COST[b.lane] for b in self.slots)  # a cheaper lane than every slot's
            assert self.s.yields_to(batch)  # one tenant: every express forward is the lane express's
            self.express.append(batch)
        assert not any(self.s.yields_to(b) for b in self.slots)  # the slots' forwards are the ones that yield
        assert len(self.express) == self.s.express_running <= self.s.max_in_flight  # never more than the slots
        if len(self.express) < self.s.max_in_flight and self.slots and all(b.lane == "media" for b in self.slots):
            waiting = {r.lane for r in self.s.unplanned_rows} | {b.lane for b in self.s.planned_forwards}
            assert "text" not in waiting, "a text row waits while an express thread is free"

    def end(self, pick: int, longest: int | None = None) -> None:
        """End the running forward PICK chooses, or one that ran LONGEST steps already (a forward
        on a device always ends)."""
        self.step += 1
        running = self.slots + self.express
        for b in running:
            self.started.setdefault(id(b), self.step)
        batch = running[pick % len(running)]
        oldest = min(running, key=lambda b: self.started[id(b)])
        if longest is not None and self.step - self.started[id(oldest)] >= longest:
            batch = oldest
        del self.started[id(batch)]
        if any(batch is b for b in self.express):
            self.express = [b for b in self.express if b is not batch]
        else:
            self.slots.remove(batch)
        self.ran_rows.extend((r.request_id, r.index) for r in batch.rows)
        self.answered.extend(a.request_id for a in self.s.complete(batch, [r.payload for r in batch.rows]))

    def busy(self) -> bool:
        return bool(self.slots or self.express)


def submit(s: Scheduler, texts: int, images: int, exact: bool) -> int:
    for i in range(images):
        s.submit([RowSpec(MEDIA, ("m", i), "media")], NOW, exact=exact)
    for i in range(texts):
        s.submit([RowSpec(8, ("t", i), "text"), RowSpec(8, ("u", i), "text")], NOW, exact=exact)
    return texts + images


@settings(max_examples=150, deadline=None)
@given(steps)
def test_every_request_runs_once_and_no_text_row_waits_for_a_free_express(
    plan: list[tuple[int, int, bool, int]],
) -> None:
    s = scheduler(slots=2)
    d = Driver(s)
    submitted = 0
    for texts, images, exact, pick in plan:
        submitted += submit(s, texts, images, exact)
        d.hand_out()
        if d.busy():
            d.end(pick)
    d.hand_out()
    while d.busy():
        d.end(0)
        d.hand_out()
    assert sorted(d.answered) == list(range(submitted))
    assert len(d.ran_rows) == len(set(d.ran_rows))  # no row ran twice


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 8), st.lists(st.integers(0, 5), min_size=1, max_size=8))
def test_a_stream_of_text_never_starves_the_image_lane(images: int, picks: list[int]) -> None:
    """Images queued once, then one text request arrives before every forward ends (PICKS choose
    which ends, cycled; a forward ends within 3 steps): every image request is answered within a
    bound of forwards."""
    s = scheduler(slots=2)
    d = Driver(s)
    image_ids = {s.submit([RowSpec(MEDIA, ("m", i), "media")], NOW) for i in range(images)}
    bound = 4 * images + 8
    for step in range(bound):
        s.submit([RowSpec(8, ("t", step), "text")], NOW)
        d.hand_out()
        d.end(picks[step % len(picks)], longest=3)
        if image_ids <= set(d.answered):
            return
    raise AssertionError(f"image requests left after {bound} forwards: {sorted(image_ids - set(d.answered))}")
