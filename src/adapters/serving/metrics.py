"""A small Prometheus registry (text exposition format 0.0.4): counters, gauges, histograms.

Thread-safe enough for our use: increments happen on the event loop; the device thread only
reports through the loop.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Callable

Labels = tuple[tuple[str, str], ...]


def _labels(labels: dict[str, str] | None) -> Labels:
    return tuple(sorted((labels or {}).items()))


def _fmt_labels(labels: Labels, extra: tuple[tuple[str, str], ...] = ()) -> str:
    items = labels + extra
    if not items:
        return ""
    body = ",".join(f'{k}="{_escape(v)}"' for k, v in items)
    return "{" + body + "}"


def _escape(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(v: float) -> str:
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if float(v).is_integer():
        return str(int(v))
    return repr(float(v))


@dataclass
class Counter:
    name: str
    help: str
    values: dict[Labels, float] = field(default_factory=dict)
    kind: str = "counter"

    def inc(self, labels: dict[str, str] | None = None, amount: float = 1.0) -> None:
        key = _labels(labels)
        self.values[key] = self.values.get(key, 0.0) + amount

    def get(self, labels: dict[str, str] | None = None) -> float:
        return self.values.get(_labels(labels), 0.0)

    def render(self) -> list[str]:
        out = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]
        out += [f"{self.name}{_fmt_labels(k)} {_num(v)}" for k, v in sorted(self.values.items())]
        return out


@dataclass
class Gauge(Counter):
    kind: str = "gauge"
    functions: dict[Labels, Callable[[], float]] = field(default_factory=dict)

    def set(self, value: float, labels: dict[str, str] | None = None) -> None:
        self.values[_labels(labels)] = value

    def set_function(self, fn: Callable[[], float], labels: dict[str, str] | None = None) -> None:
        self.functions[_labels(labels)] = fn

    def render(self) -> list[str]:
        for key, fn in self.functions.items():
            self.values[key] = float(fn())
        return super().render()


@dataclass
class Histogram:
    name: str
    help: str
    buckets: tuple[float, ...]
    series: dict[Labels, list[float]] = field(default_factory=dict)  # bucket counts + [sum, count]

    def observe(self, value: float, labels: dict[str, str] | None = None) -> None:
        key = _labels(labels)
        counts = self.series.get(key)
        if counts is None:
            counts = self.series[key] = [0.0] * (len(self.buckets) + 2)
        counts[bisect.bisect_left(self.buckets, value)] += 1  # first bucket whose bound >= value
        counts[-2] += value
        counts[-1] += 1

    def render(self) -> list[str]:
        out = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        for key, counts in sorted(self.series.items()):
            running = 0.0
            for bound, c in zip(self.buckets, counts):
                running += c
                out.append(f"{self.name}_bucket{_fmt_labels(key, (('le', _num(bound)),))} {_num(running)}")
            out.append(f"{self.name}_bucket{_fmt_labels(key, (('le', '+Inf'),))} {_num(counts[-1])}")
            out.append(f"{self.name}_sum{_fmt_labels(key)} {_num(counts[-2])}")
            out.append(f"{self.name}_count{_fmt_labels(key)} {_num(counts[-1])}")
        return out


class Registry:
    def __init__(self) -> None:
        self._metrics: dict[str, Counter | Gauge | Histogram] = {}

    def counter(self, name: str, help: str) -> Counter:
        return self._metrics.setdefault(name, Counter(name, help))  # type: ignore[return-value]

    def gauge(self, name: str, help: str) -> Gauge:
        return self._metrics.setdefault(name, Gauge(name, help))  # type: ignore[return-value]

    def histogram(self, name: str, help: str, buckets: tuple[float, ...]) -> Histogram:
        return self._metrics.setdefault(name, Histogram(name, help, tuple(sorted(buckets))))  # type: ignore[return-value]

    def render(self) -> str:
        lines: list[str] = []
        for metric in self._metrics.values():
            lines += metric.render()
        return "\n".join(lines) + "\n"


SECONDS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
ROWS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
TOKENS_BUCKETS = (8, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
RATIO_BUCKETS = (0.1, 0.25, 0.5, 0.75, 0.9, 1.0)


class RuntimeMetrics:
    """The worker's metrics (R-API-7)."""

    def __init__(self) -> None:
        r = self.registry = Registry()
        self.requests = r.counter("vllm_srun_requests_total", "Requests answered, by model, surface and code")
        self.errors = r.counter("vllm_srun_errors_total", "Error responses by code")
        self.request_seconds = r.histogram("vllm_srun_request_duration_seconds", "Request time", SECONDS_BUCKETS)
        self.queue_seconds = r.histogram("vllm_srun_queue_duration_seconds", "Time before a request's first forward", SECONDS_BUCKETS)
        self.forwards = r.counter("vllm_srun_forwards_total", "Forwards run, by model, lane and outcome")
        self.forward_seconds = r.histogram("vllm_srun_forward_duration_seconds", "Forward time", SECONDS_BUCKETS)
        self.batch_rows = r.histogram("vllm_srun_batch_rows", "Rows per forward", ROWS_BUCKETS)
        self.batch_tokens = r.histogram("vllm_srun_batch_tokens", "Counted (padded or packed) tokens per forward", TOKENS_BUCKETS)
        self.batch_fill = r.histogram("vllm_srun_batch_fill_ratio", "Real tokens / counted tokens per forward", RATIO_BUCKETS)
        self.rows = r.counter("vllm_srun_rows_total", "Rows run on a device")
        self.queue_depth = r.gauge("vllm_srun_queue_depth", "Rows waiting for a forward")
        self.ready = r.gauge("vllm_srun_ready", "1 when the model is ready")
        self.cache = r.counter("vllm_srun_result_cache_total", "Result cache lookups by outcome (hit|miss)")
        self.cancelled_rows = r.counter("vllm_srun_cancelled_requests_total", "Requests dropped before they finished (client went away or deadline)")

    def render(self) -> str:
        return self.registry.render()
