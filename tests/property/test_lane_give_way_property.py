"""R-BAT-6's give-way as a property: for any arrival pattern of one-row text and image requests
between forwards (text cheaper per token), every request is answered exactly once, and a text
request never waits for more than one image forward handed out after it arrived."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.test_lane_give_way import MEDIA, NOW, run, scheduler
from vllm_srun.domain.scheduling.rows import RowSpec

arrivals = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 3)), min_size=1, max_size=30)


@settings(max_examples=150, deadline=None)
@given(arrivals)
def test_text_waits_at_most_one_image_forward_and_every_request_runs_once(steps: list[tuple[int, int]]) -> None:
    s = scheduler()
    waiting: dict[int, int] = {}  # text request → image forwards handed out since it arrived
    answered: list[int] = []
    submitted = 0

    def step() -> bool:
        batch = s.next_forward(NOW)
        if batch is None:
            return False
        for r in batch.rows:
            if batch.lane == "text":
                assert waiting.pop(r.request_id) <= 1
        if batch.lane == "media":
            for rid in waiting:
                waiting[rid] += 1
        answered.extend(a.request_id for a in s.complete(batch, [r.payload for r in batch.rows]))
        return True

    for texts, images in steps:
        for _ in range(images):
            s.submit([RowSpec(MEDIA, None, "media")], NOW)
            submitted += 1
        for _ in range(texts):
            waiting[s.submit([RowSpec(8, None, "text")], NOW)] = 0
            submitted += 1
        step()
    while step():
        pass
    assert sorted(answered) == list(range(submitted))
    assert not waiting


def test_the_property_sees_a_give_way() -> None:
    """The property above is not vacuous: without the give-way a text row would wait behind
    three image forwards here."""
    s = scheduler()
    for _ in range(4):
        s.submit([RowSpec(MEDIA, None, "media")], NOW)
    first = s.next_forward(NOW)
    assert first is not None and first.lane == "media"
    s.submit([RowSpec(8, None, "text")], NOW)
    run(s, first)
    second = s.next_forward(NOW)
    assert second is not None and second.lane == "text"
