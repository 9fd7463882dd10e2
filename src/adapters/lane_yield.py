"""Yield points of a costlier lane's forward (R-BAT-6): while a lane express forward runs (a cheaper
lane's rows beside slots that all run a costlier lane's forwards), a slot's forward pauses at its
next yield point until the express forwards have ended, at most `YIELD_CAP_S` at each point.

On a CPU the express forward shares the cores with the slots' forwards (and the event loop, and
the media workers): the lower nice of the slots' threads (`VLLM_SRUN_FORWARD_NICE`) only tilts
that share. A slot's forward that pauses gives the cheap lane's forward the cores it would have
had with the slots idle, which is the lane rule's promise ("an image forward's time never makes
text forwards look slow"). The pause is bounded: a forward waits at most the cap at each point
and has a fixed number of points (the model code's), so a stream of cheap rows delays a costly
forward by at most points × cap and never starves it. Answers never change: a pause only delays
the next block.

Model code calls `yield_point()` between its blocks (the vision tower's, and before the language
model's layer stack of a forward that read media); it does nothing unless the forward running on
this thread was started under `yielding(gate)` (the scheduler loop does that for every slot
forward of a lane costlier per token than the model's cheapest, `Scheduler.may_yield`; the lane
express forwards hold the gate, `Scheduler.yields_to`). `VLLM_SRUN_LANE_YIELD=0` turns it off
(`domain/worker/threads.lane_yield`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

YIELD_CAP_S = 0.05  # the longest a forward waits at one yield point


class YieldGate:
    """Held while one or more lane express forwards run (`hold` / `release`, from any thread);
    `wait` blocks while it is held, at most CAP_S seconds."""

    def __init__(self, cap_s: float = YIELD_CAP_S) -> None:
        if cap_s <= 0:
            raise ValueError(f"a yield cap is a positive number of seconds, got {cap_s}")
        self.cap_s = cap_s
        self._open = threading.Event()
        self._open.set()
        self._held = 0
        self._lock = threading.Lock()
        self.pauses = 0  # yield points that found the gate held

    @property
    def held(self) -> bool:
        return not self._open.is_set()

    def hold(self) -> None:
        with self._lock:
            self._held += 1
            self._open.clear()

    def release(self) -> None:
        with self._lock:
            if self._held == 0:
                raise ValueError("release without a hold")
            self._held -= 1
            if self._held == 0:
                self._open.set()

    def wait(self) -> None:
        if not self._open.is_set():
            self.pauses += 1
            self._open.wait(self.cap_s)


_current = threading.local()


@contextmanager
def yielding(gate: YieldGate | None) -> Iterator[None]:
    """The forward run inside pauses at its yield points while GATE is held (None: never)."""
    before = getattr(_current, "gate", None)
    _current.gate = gate
    try:
        yield
    finally:
        _current.gate = before


def yield_point() -> None:
    """A point between two blocks of a forward where it may pause for a lane express forward."""
    gate = getattr(_current, "gate", None)
    if gate is not None:
        gate.wait()
