"""The batch window (R-BAT-4) as a small state machine.

After the first row arrives in an empty queue the scheduler waits `window_s`, then plans the
whole queue. Each queued row waits at most the window after its arrival unless the device is
busy; rows that queue while a forward runs are merged into the next plan, and are planned at
once when that forward ends if their window has passed by then. A queue that already fills a
whole forward is planned without waiting. A batch-invariant model has no window (R-BAT-5).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class WindowState(enum.Enum):
    IDLE = "idle"  # nothing queued
    COLLECTING = "collecting"  # rows queued, window still open
    DUE = "due"  # rows queued and the window has closed (or a forward is full)
    BUSY = "busy"  # a forward is running; arrivals wait for the next plan


@dataclass(frozen=True, slots=True)
class BatchWindow:
    window_s: float

    def __post_init__(self) -> None:
        if self.window_s < 0:
            raise ValueError("batch window must be >= 0")

    def state(self, *, now: float, oldest_arrival: float | None, busy: bool, full: bool) -> WindowState:
        if busy:
            return WindowState.BUSY
        if oldest_arrival is None:
            return WindowState.IDLE
        if full or now >= oldest_arrival + self.window_s:
            return WindowState.DUE
        return WindowState.COLLECTING

    def closes_at(self, oldest_arrival: float) -> float:
        return oldest_arrival + self.window_s
