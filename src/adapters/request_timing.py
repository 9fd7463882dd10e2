"""One request's timing (parse, queue, forward, total in ms), filled as it is served and sent
back as `Server-Timing` by the HTTP adapter."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

SCOPE_KEY = "srun_timing"  # where the HTTP adapter keeps it in the ASGI scope


@dataclass(slots=True)
class RequestTiming:
    start: float = field(default_factory=time.perf_counter)
    parse_ms: float = 0.0
    queue_ms: float = 0.0
    forward_ms: float = 0.0

    def header(self) -> str:
        total = (time.perf_counter() - self.start) * 1000
        return (
            f"parse;dur={self.parse_ms:.3f}, queue;dur={self.queue_ms:.3f}, "
            f"forward;dur={self.forward_ms:.3f}, total;dur={total:.3f}"
        )


def timing_of(scope: Mapping[str, Any]) -> RequestTiming:
    """The timing the HTTP adapter's middleware put in this request's ASGI scope."""
    timing: RequestTiming = scope[SCOPE_KEY]
    return timing
