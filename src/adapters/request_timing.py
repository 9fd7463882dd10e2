"""One request's timing, filled as it is served and sent back as `Server-Timing` by the HTTP
adapter (`http/timing.py`); its time points (`time.perf_counter`) are also what a request's
trace spans are made of (`adapters/tracing`).

The phases, in ms, as the upstream contract names them (each from marks set where it happens):
- `parse`: reading and decoding the body (the POST handler: `parse_ms`);
- `tokenize`: validating, rendering and tokenizing it into rows, and the result cache lookup:
  from admission (or the end of parse) to its first rows' submit (`ServedModel.run` marks
  `run_start`), or to its answer when no row runs (a cache hit);
- `queue` and `forward`: its rows' wait for and time in forwards (the scheduler's figures);
- `post`: assembling the answer from the rows' outputs (from `run_end`, the last rows' return,
  to `encode_start`);
- `serialize`: encoding the answer (`encode_start` to `encode_end`);
- `total`: from the request's arrival to its response head; what it holds beyond the phases is
  the server's own (admission, a Retry-After hold, the event loop).
A phase that did not happen (an error before it, a GET) is 0.
"""

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
    run_start: float = 0.0  # its first rows went to a scheduler (`ServedModel.run`)
    run_end: float = 0.0  # its last rows came back
    encode_start: float = 0.0  # serializing the answer (its assembly is done)
    encode_end: float = 0.0
    status: int = 0  # the HTTP status sent
    model: str = ""
    forwards: list[ForwardRecord] | None = None  # a list only while the request is traced

    def phases(self, now: float | None = None) -> dict[str, float]:
        """The phases in ms (module doc), `total` up to NOW (default: this moment)."""
        now = time.perf_counter() if now is None else now
        parsed = self.start + self.parse_ms / 1000 if self.parse_ms else 0.0
        began = self.admitted or parsed  # preparing starts once it is admitted (a bundle: once parsed)
        prepared = self.run_start or self.encode_start  # its rows' first submit, else its answer
        return {
            "parse": self.parse_ms,
            "tokenize": _ms(began, prepared),
            "queue": self.queue_ms,
            "forward": self.forward_ms,
            "post": _ms(self.run_end, self.encode_start),
            "serialize": _ms(self.encode_start, self.encode_end),
            "total": (now - self.start) * 1000,
        }

    def header(self) -> str:
        return ", ".join(f"{name};dur={ms:.3f}" for name, ms in self.phases().items())


def _ms(begin: float, end: float) -> float:
    """END - BEGIN in ms; 0 unless both marks were set (in order)."""
    return (end - begin) * 1000 if begin and end >= begin else 0.0


def timing_of(scope: Mapping[str, Any]) -> RequestTiming:
    """The timing the HTTP adapter's middleware put in this request's ASGI scope."""
    timing: RequestTiming = scope[SCOPE_KEY]
    return timing
