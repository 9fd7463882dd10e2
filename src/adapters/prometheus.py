"""Prometheus metrics on `prometheus_client`, behind the small call API our callers use.

Each `MetricsRegistry` owns its own `CollectorRegistry` (never the process-wide default one, so
any number of runtimes or fronts can live in one process) and declares every metric with its
label names up front. Callers pass labels as a dict:

    requests.inc({"model": "m", "code": "ok"})
    seconds.observe(0.02, {"surface": "embeddings"})
    queue_depth.set_function(lambda: 3.0, {"model": "m"})

A dict whose keys differ from the metric's declared label names raises `ValueError`.

The exposition is the Prometheus text format 0.0.4 from `prometheus_client.generate_latest`,
without the `_created` series prometheus_client adds to counters and histograms (we never
exposed them). They are dropped per registry at collection time instead of through the
process-wide `prometheus_client.disable_created_metrics()`, which would also change the
default registry and any other registry in the process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

import prometheus_client
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import Metric

Labels = Mapping[str, str]
Kind = Literal["counter", "gauge", "histogram"]
M = TypeVar("M", bound=MetricWrapperBase)

# the content type of `MetricsRegistry.render()`, the text format 0.0.4 that `generate_latest`
# writes. Spelled out: prometheus_client 0.20 has no name for it (CONTENT_TYPE_LATEST was this
# string there; newer releases call it CONTENT_TYPE_PLAIN_0_0_4 and moved LATEST to 1.0.0).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# request and forward durations, worker and front alike
SECONDS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True)
class MetricSpec:
    """One declared metric: what a scraper sees of it besides its values."""

    name: str
    kind: Kind
    labels: tuple[str, ...]
    help: str
    buckets: tuple[float, ...] = ()  # histograms only, without the implicit +Inf


class _Metric(Generic[M]):
    """Shared by the wrappers: the prometheus_client metric and its child for a label dict."""

    def __init__(self, spec: MetricSpec, metric: M) -> None:
        self.spec = spec
        self._metric = metric
        self._label_set = frozenset(spec.labels)
        # children by their label dict's items: every request counts into a few series, and
        # prometheus_client's `labels()` checks and converts the names and values on each call
        self._children: dict[tuple[tuple[str, object], ...], M] = {}

    @property
    def name(self) -> str:
        return self.spec.name

    def _child(self, labels: Labels | None) -> M:
        if labels:
            key = tuple(labels.items())
            child = self._children.get(key)
            if child is not None:
                return child
            child = self._checked_child(labels)
            self._children[key] = child
            return child
        return self._checked_child(labels)

    def _checked_child(self, labels: Labels | None) -> M:
        if not self.spec.labels:
            if labels:
                raise ValueError(f"{self.name} takes no labels, got {sorted(labels)}")
            return self._metric
        if labels is None:
            raise ValueError(f"{self.name} needs labels {list(self.spec.labels)}")
        if labels.keys() != self._label_set:
            raise ValueError(f"{self.name} takes labels {list(self.spec.labels)}, got {sorted(labels)}")
        return self._metric.labels(**labels)

    def get(self, labels: Labels | None = None) -> float:
        """The value of the series with exactly these labels (0.0 when it does not exist yet).

        Meant for tests; it does not create the series.
        """
        wanted = {k: str(v) for k, v in (labels or {}).items()}
        for family in self._metric.collect():
            for sample in family.samples:
                if sample.name == self.name and sample.labels == wanted:
                    return float(sample.value)
        return 0.0

    def remove(self, labels: Labels) -> None:
        """Drop the series with these labels (e.g. of a replica that was retired); none: no-op."""
        values = [str(labels[name]) for name in self.spec.labels]
        self._children.clear()  # a later count of these labels makes a new series
        try:
            self._metric.remove(*values)
        except KeyError:
            pass


class Counter(_Metric[prometheus_client.Counter]):
    def inc(self, labels: Labels | None = None, amount: float = 1.0) -> None:
        self._child(labels).inc(amount)


class Gauge(_Metric[prometheus_client.Gauge]):
    def set(self, value: float, labels: Labels | None = None) -> None:
        self._child(labels).set(value)

    def set_function(self, fn: Callable[[], float], labels: Labels | None = None) -> None:
        """Compute this series' value with FN at every scrape (replaces any earlier value or function)."""
        self._child(labels).set_function(fn)


class Histogram(_Metric[prometheus_client.Histogram]):
    def observe(self, value: float, labels: Labels | None = None) -> None:
        self._child(labels).observe(value)


class MetricsRegistry:
    """Declares metrics on its own CollectorRegistry and renders them (a prometheus_client Collector)."""

    def __init__(self) -> None:
        self.collectors = prometheus_client.CollectorRegistry()
        self.specs: list[MetricSpec] = []

    def counter(self, name: str, help: str, labels: tuple[str, ...] = ()) -> Counter:
        # prometheus_client exposes a counter's samples as <family>_total whatever it is given;
        # insisting on the suffix keeps the declared name the exposed one.
        if not name.endswith("_total"):
            raise ValueError(f"counter {name!r} must end with _total")
        spec = self._declare(MetricSpec(name, "counter", labels, help))
        return Counter(spec, prometheus_client.Counter(name, help, labels, registry=self.collectors))

    def gauge(self, name: str, help: str, labels: tuple[str, ...] = ()) -> Gauge:
        spec = self._declare(MetricSpec(name, "gauge", labels, help))
        return Gauge(spec, prometheus_client.Gauge(name, help, labels, registry=self.collectors))

    def histogram(self, name: str, help: str, labels: tuple[str, ...], buckets: tuple[float, ...]) -> Histogram:
        spec = self._declare(MetricSpec(name, "histogram", labels, help, tuple(float(b) for b in buckets)))
        metric = prometheus_client.Histogram(name, help, labels, registry=self.collectors, buckets=spec.buckets)
        return Histogram(spec, metric)

    def _declare(self, spec: MetricSpec) -> MetricSpec:
        if any(s.name == spec.name for s in self.specs):
            raise ValueError(f"metric {spec.name!r} declared twice")
        self.specs.append(spec)
        return spec

    def collect(self) -> Iterator[Metric]:
        """Every family of the registry, less its `_created` samples."""
        for family in self.collectors.collect():
            created = family.name + "_created"
            family.samples = [s for s in family.samples if s.name != created]
            yield family

    def render(self) -> str:
        """The text exposition (format 0.0.4, `CONTENT_TYPE`); gauge functions run now."""
        return prometheus_client.generate_latest(self).decode()
