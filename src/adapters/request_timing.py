"""One request's timing (parse, queue, forward, total in ms), filled as it is served and sent
back as `Server-Timing` by the HTTP adapter; its time points (`time.perf_counter`) are also what
a request's trace spans are made of (`adapters/tracing`)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

SCOPE_KEY = "srun_timing"  # where the HTTP adapter keeps it in the ASGI scope


@dataclass(frozen=True, slots=True)
class ForwardRecord:
    """One forward a traced request's rows took part in (the scheduler loop writes it)."""

    batch_id: int  # unique in the worker process: requests that shared a forward share it
    lane: str
    rows: int  # the forward's rows, all requests'
    requests: int  # the requests whose rows it ran
    tokens: int  # as the lane counts them (padded)
    start: float  # time.perf_counter()
    end: float
    ok: bool = True


@dataclass(slots=True)
class RequestTiming:
    start: float = field(default_factory=time.perf_counter)
    parse_ms: float = 0.0
    queue_ms: float = 0.0
    forward_ms: float = 0.0
    # what tracing reads (perf_counter; 0: the step did not happen)
    admitted: float = 0.0  # admission let it in (R-ADM-1)
    encode_start: float = 0.0  # serializing the answer
    encode_end: float = 0.0
    status: int = 0  # the HTTP status sent
    model: str = ""
    forwards: list[ForwardRecord] | None = None  # a list only while the request is traced

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
