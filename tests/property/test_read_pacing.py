"""R-FAIR-5: whose next request waits its turn to be read (`domain/scheduling/read_pacing.py`), against
random sequences of requests starting and finishing for tenants of random weights."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from vllm_srun.domain.scheduling.read_pacing import ACTIVE_S, FLOOR, ReadPacing

TENANTS = ["a", "b", "c", "d"]
FLOOR_HERE = 3  # a small floor, so that random walks cross it often
WEIGHTS = {"a": 1.0, "b": 2.0, "c": 3.0, "d": 0.5}


class ReadPacingMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.pacing = ReadPacing(WEIGHTS.__getitem__, floor=FLOOR_HERE)
        self.now = 0.0
        self.in_progress = dict.fromkeys(TENANTS, 0)

    @rule(tenant=st.sampled_from(TENANTS))
    def start(self, tenant: str) -> None:
        self.pacing.started(tenant, self.now)
        self.in_progress[tenant] += 1

    @precondition(lambda self: any(self.in_progress.values()))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        tenant = data.draw(st.sampled_from([t for t, n in self.in_progress.items() if n]))
        self.pacing.finished(tenant)
        self.in_progress[tenant] -= 1

    @rule(dt=st.floats(0.0, 2 * ACTIVE_S))
    def wait(self, dt: float) -> None:
        self.now += dt

    @invariant()
    def counts_are_kept(self) -> None:
        assert all(self.pacing.in_progress(t) == n for t, n in self.in_progress.items())

    @invariant()
    def a_tenant_under_the_floor_is_never_paced(self) -> None:
        assert not any(self.pacing.paced(t, self.now) for t, n in self.in_progress.items() if n < FLOOR_HERE)

    @invariant()
    def a_tenant_alone_is_never_paced(self) -> None:
        if len(self.pacing.active(self.now)) < 2:
            assert not any(self.pacing.paced(t, self.now) for t in TENANTS)

    @invariant()
    def when_every_active_tenant_holds_work_one_is_read_at_once(self) -> None:
        active = self.pacing.active(self.now)
        if active and all(self.in_progress[t] for t in active):
            assert not all(self.pacing.paced(t, self.now) for t in active)

    @invariant()
    def paced_means_at_the_floor_and_over_the_weights_share(self) -> None:
        active = self.pacing.active(self.now)
        total = sum(self.in_progress[t] for t in active)
        weights = sum(WEIGHTS[t] for t in active)
        for t in active:
            over = self.in_progress[t] / total > WEIGHTS[t] / weights + 1e-9 if total else False
            floor = self.in_progress[t] >= FLOOR_HERE
            if len(active) >= 2 and over and floor:
                assert self.pacing.paced(t, self.now)
            if not (over and floor):
                assert not self.pacing.paced(t, self.now)


ReadPacingMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
TestReadPacing = ReadPacingMachine.TestCase


@given(flood=st.integers(FLOOR, 500), other=st.integers(0, 3))
def test_a_flooding_tenant_is_paced_at_the_floor_while_another_is_active(flood: int, other: int) -> None:
    pacing = ReadPacing(lambda t: 1.0)
    pacing.started("b", 0.0)
    for _ in range(flood):
        pacing.started("a", 0.1)
    if other == 0:
        pacing.finished("b")  # b holds nothing, but asked within the last second
    else:
        for _ in range(other - 1):
            pacing.started("b", 0.1)
    assert pacing.paced("a", 0.5)
    assert not pacing.paced("b", 0.5)
    if other == 0:
        assert not pacing.paced("a", 0.1 + ACTIVE_S + 0.01)  # b went quiet: a is alone again
    for _ in range(flood - FLOOR + 1):
        pacing.finished("a")
    assert not pacing.paced("a", 0.5)  # under the floor: read at once
