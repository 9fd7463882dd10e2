"""When a crashed worker is started again (R-REP-4): capped exponential backoff.

The first restart waits `initial_s` (1 s), each further one twice as long, at most `max_s`
(60 s). A worker that stayed up for `stable_s` (60 s) before it died starts the sequence over,
so a worker that crashes once a day always comes back after 1 s while a worker that crashes
at start does not spin. Pure: the caller passes the times.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RestartBackoff:
    initial_s: float = 1.0
    max_s: float = 60.0
    stable_s: float = 60.0
    last_delay_s: float = 0.0  # 0: no restart since the last stable period

    def __post_init__(self) -> None:
        if not 0 < self.initial_s <= self.max_s:
            raise ValueError("restart backoff needs 0 < initial_s <= max_s")
        if self.stable_s <= 0:
            raise ValueError("stable_s must be > 0")

    def next_delay(self, started_at: float, died_at: float) -> float:
        """How long to wait before starting a worker that ran from `started_at` to `died_at`."""
        if died_at - started_at >= self.stable_s or self.last_delay_s <= 0:
            self.last_delay_s = self.initial_s
        else:
            self.last_delay_s = min(self.last_delay_s * 2, self.max_s)
        return self.last_delay_s

    def reset(self) -> None:
        self.last_delay_s = 0.0
