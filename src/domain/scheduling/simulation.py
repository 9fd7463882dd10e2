"""A discrete-event simulator of one model's scheduler against a device cost model (R-BAT-8).

The same Scheduler that serves requests replays a trace (arrival time + row lengths per
request) against a linear device model: a forward costs `overhead + per_token × counted
tokens`. It reports throughput, forwards and latency percentiles, so batch limits and windows
can be compared without a device.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from vllm_srun.domain.ports import Rng
from vllm_srun.domain.scheduling.lanes import Lane
from vllm_srun.domain.scheduling.planning import Budget
from vllm_srun.domain.scheduling.rows import RowSpec
from vllm_srun.domain.scheduling.scheduler import Scheduler


@dataclass(frozen=True, slots=True)
class TraceRequest:
    arrival: float  # seconds from the start
    rows: tuple[int, ...]  # token count of each row


@dataclass(frozen=True, slots=True)
class DeviceModel:
    overhead_s: float = 0.002
    per_token_s: float = 2e-5

    def forward_seconds(self, tokens: int) -> float:
        return self.overhead_s + self.per_token_s * tokens


@dataclass
class SimulationReport:
    requests: int
    rows: int
    forwards: int
    makespan_s: float
    latencies_s: list[float] = field(default_factory=list)
    padded_tokens: int = 0
    real_tokens: int = 0

    @property
    def throughput_rps(self) -> float:
        return self.requests / self.makespan_s if self.makespan_s > 0 else math.inf

    @property
    def fill_ratio(self) -> float:
        return self.real_tokens / self.padded_tokens if self.padded_tokens else 1.0

    def percentile_ms(self, q: float) -> float:
        xs = sorted(self.latencies_s)
        if not xs:
            return 0.0
        return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000


def synthetic_trace(
    rng: Rng, *, requests: int, rate_rps: float, rows_per_request: int, min_tokens: int, max_tokens: int
) -> list[TraceRequest]:
    """Poisson arrivals at `rate_rps`, each request with rows of uniformly random length."""
    out, t = [], 0.0
    for _ in range(requests):
        t += -math.log(1.0 - rng.random()) / rate_rps
        rows = tuple(min_tokens + int(rng.random() * (max_tokens - min_tokens + 1)) for _ in range(rows_per_request))
        out.append(TraceRequest(t, rows))
    return out


def simulate(
    trace: Sequence[TraceRequest],
    *,
    lane: Lane,
    budget: Budget,
    window_s: float,
    device: DeviceModel,
    batch_invariant: bool = False,
) -> SimulationReport:
    scheduler = Scheduler([lane], budget, window_s=window_s, batch_invariant=batch_invariant)
    pending = sorted(trace, key=lambda r: r.arrival)
    arrivals: dict[int, float] = {}
    report = SimulationReport(requests=len(pending), rows=sum(len(r.rows) for r in pending), forwards=0, makespan_s=0.0)
    now, i, busy_until, start = 0.0, 0, 0.0, 0.0
    in_flight = None
    while i < len(pending) or in_flight is not None or scheduler.pending_requests:
        if in_flight is not None and busy_until <= now:
            for answer in scheduler.complete(in_flight, [None] * len(in_flight.rows), busy_until - start):
                report.latencies_s.append(busy_until - arrivals.pop(answer.request_id))
            in_flight = None
        while i < len(pending) and pending[i].arrival <= now:
            req = pending[i]
            rid = scheduler.submit([RowSpec(n, None, lane.name) for n in req.rows], req.arrival)
            arrivals[rid] = req.arrival
            i += 1
        if in_flight is None:
            batch = scheduler.next_forward(now)
            if batch is not None:
                start = now
                busy_until = now + device.forward_seconds(batch.tokens)
                in_flight = batch
                report.forwards += 1
                report.padded_tokens += batch.tokens
                report.real_tokens += sum(r.tokens for r in batch.rows)
                continue
        # jump to the next event: a forward ends, a request arrives, or the window closes
        events = [
            t
            for t in (
                busy_until if in_flight is not None else None,
                pending[i].arrival if i < len(pending) else None,
                scheduler.wake_at(),
            )
            if t is not None and t > now
        ]
        if not events:
            break
        now = min(events)
    report.makespan_s = now
    return report
