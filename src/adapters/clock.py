"""The process's monotonic clock behind the domain's `Clock` port."""

from __future__ import annotations

import time


class MonotonicClock:
    def now(self) -> float:
        return time.monotonic()
