"""Both metrics registries on prometheus_client: what a scraper parses out of `/metrics`.

The names, types and labels a scraper sees come from the declarations (which
test_metrics_docs.py pins to docs/metrics.md); the bucket bounds are pinned here, as a scraper
sees them.
"""

from __future__ import annotations

import prometheus_client
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.prometheus_text import metric, samples
from vllm_srun.adapters.front.metrics import FrontEvents, FrontMetrics
from vllm_srun.adapters.prometheus import CONTENT_TYPE, Counter, Gauge, Histogram, MetricsRegistry
from vllm_srun.adapters.serving.metrics import RuntimeMetrics
from vllm_srun.adapters.serving.result_cache import ResultCache
from vllm_srun.domain.fleet.ejection import EjectionWithheld, ReplicaBackedOff, ReplicaEjected, ReplicaReadmitted

SECONDS_LE = [
    "0.0005",
    "0.001",
    "0.0025",
    "0.005",
    "0.01",
    "0.025",
    "0.05",
    "0.1",
    "0.25",
    "0.5",
    "1.0",
    "2.5",
    "5.0",
    "10.0",
    "+Inf",
]
ROWS_LE = ["1.0", "2.0", "4.0", "8.0", "16.0", "32.0", "64.0", "128.0", "256.0", "512.0", "1024.0", "+Inf"]
TOKENS_LE = [
    "8.0",
    "32.0",
    "64.0",
    "128.0",
    "256.0",
    "512.0",
    "1024.0",
    "2048.0",
    "4096.0",
    "8192.0",
    "16384.0",
    "32768.0",
    "65536.0",
    "+Inf",
]
RATIO_LE = ["0.1", "0.25", "0.5", "0.75", "0.9", "1.0", "+Inf"]


def touch_every_metric(metrics: RuntimeMetrics | FrontMetrics) -> None:
    """One value in every metric, each label's value being '<label>-value'."""
    for m in vars(metrics).values():
        if isinstance(m, (Counter, Gauge, Histogram)):
            labels = {name: f"{name}-value" for name in m.spec.labels}
            if isinstance(m, Counter):
                m.inc(labels, 2)
            elif isinstance(m, Gauge):
                m.set(5, labels)
            else:
                m.observe(3, labels)


def check_exposition(registry: MetricsRegistry) -> None:
    """Every declared metric, and nothing else, parses back with its type, names and labels."""
    text = registry.render()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    by_family = {s.name.removesuffix("_total") if s.kind == "counter" else s.name: s for s in registry.specs}
    assert families.keys() == by_family.keys()
    for family_name, family in families.items():
        spec = by_family[family_name]
        assert family.type == spec.kind and family.documentation == spec.help
        assert f"# TYPE {spec.name} {spec.kind}" in text.splitlines()  # counters keep their _total name
        suffixes = ("_bucket", "_count", "_sum") if spec.kind == "histogram" else ("",)
        assert {s.name for s in family.samples} == {spec.name + suffix for suffix in suffixes}
        for sample in family.samples:
            le = {"le"} if sample.name.endswith("_bucket") else set()
            assert sample.labels.keys() == set(spec.labels) | le
            assert all(sample.labels[name] == f"{name}-value" for name in spec.labels)
    assert "_created" not in text


@pytest.mark.parametrize("make", [RuntimeMetrics, FrontMetrics])
def test_the_exposition_parses_back_to_the_declared_metrics(make: type[RuntimeMetrics | FrontMetrics]) -> None:
    metrics = make()
    touch_every_metric(metrics)
    check_exposition(metrics.registry)
    counter = next(m for m in vars(metrics).values() if isinstance(m, Counter))
    assert metric(metrics.render(), counter.name) == 2


@pytest.mark.parametrize("make", [RuntimeMetrics, FrontMetrics])
def test_a_series_appears_once_it_has_a_value(make: type[RuntimeMetrics | FrontMetrics]) -> None:
    text = make().render()
    assert samples(text) == []  # HELP and TYPE lines only, as before prometheus_client
    assert text.count("# TYPE ") == len(make().registry.specs)


def test_worker_histograms_keep_their_bucket_bounds() -> None:
    metrics = RuntimeMetrics()
    forward = {"model": "m", "lane": "text"}
    metrics.batch_rows.observe(4, forward)  # on a bound: counted in that bucket, as before
    metrics.batch_tokens.observe(100, forward)
    metrics.batch_fill.observe(0.8, forward)
    metrics.forward_seconds.observe(0.003, forward)
    metrics.request_seconds.observe(20.0, {"surface": "embeddings"})  # past the last bound: +Inf only
    text = metrics.render()

    def buckets(name: str) -> list[tuple[str, float]]:
        return [(s.labels["le"], s.value) for s in samples(text) if s.name == name + "_bucket"]

    assert buckets("vllm_srun_batch_rows") == [(le, float(i >= 2)) for i, le in enumerate(ROWS_LE)]
    assert buckets("vllm_srun_batch_tokens") == [(le, float(i >= 3)) for i, le in enumerate(TOKENS_LE)]
    assert buckets("vllm_srun_batch_fill_ratio") == [(le, float(i >= 4)) for i, le in enumerate(RATIO_LE)]
    assert buckets("vllm_srun_forward_duration_seconds") == [(le, float(i >= 3)) for i, le in enumerate(SECONDS_LE)]
    assert buckets("vllm_srun_request_duration_seconds") == [(le, float(le == "+Inf")) for le in SECONDS_LE]
    assert metric(text, "vllm_srun_batch_rows_sum") == 4 and metric(text, "vllm_srun_batch_rows_count") == 1


def test_front_request_seconds_keep_their_bucket_bounds() -> None:
    metrics = FrontMetrics()
    metrics.request_seconds.observe(0.0005, {"deployment": "d"})
    got = [
        (s.labels["le"], s.value)
        for s in samples(metrics.render())
        if s.name == "vllm_sr_request_duration_seconds_bucket"
    ]
    assert got == [(le, 1.0) for le in SECONDS_LE]


def test_the_content_type_is_prometheus_client_s_for_format_0_0_4() -> None:
    from prometheus_client import exposition

    assert getattr(exposition, "CONTENT_TYPE_PLAIN_0_0_4", exposition.CONTENT_TYPE_LATEST) == CONTENT_TYPE


def test_gauge_functions_run_at_every_scrape() -> None:
    metrics = RuntimeMetrics()
    depth = [2.0]
    metrics.queue_depth.set_function(lambda: depth[0], {"model": "m"})
    metrics.ready.set_function(lambda: 1.0, {"model": "m"})
    assert metric(metrics.render(), "vllm_srun_queue_depth", model="m") == 2
    depth[0] = 7.0
    assert metric(metrics.render(), "vllm_srun_queue_depth", model="m") == 7
    assert metrics.queue_depth.get({"model": "m"}) == 7 and metrics.ready.get({"model": "m"}) == 1


def test_each_metric_takes_exactly_its_declared_labels() -> None:
    metrics = RuntimeMetrics()
    with pytest.raises(ValueError, match="takes labels"):
        metrics.requests.inc({"model": "m", "code": "ok"})  # surface missing
    with pytest.raises(ValueError, match="takes labels"):
        metrics.forward_seconds.observe(1.0, {"model": "m", "lane": "text", "outcome": "ok"})
    with pytest.raises(ValueError, match="needs labels"):
        metrics.ready.set(1.0)
    assert samples(metrics.render()) == []


def test_a_series_counted_again_and_again_is_one_series_until_removed() -> None:
    """Children are kept per label dict (the hot path): the order of the keys does not matter, a
    wrong dict is still refused after good ones, and a removed series starts again from zero."""
    metrics = RuntimeMetrics()
    labels = {"model": "m", "surface": "embeddings", "code": "ok"}
    for _ in range(3):
        metrics.requests.inc(labels)
    metrics.requests.inc({"code": "ok", "surface": "embeddings", "model": "m"})
    assert metrics.requests.get(labels) == 4
    assert len([s for s in samples(metrics.render()) if s[0] == "vllm_srun_requests_total"]) == 1
    with pytest.raises(ValueError, match="takes labels"):
        metrics.requests.inc({"model": "m", "code": "ok"})
    metrics.requests.remove(labels)
    assert metrics.requests.get(labels) == 0
    metrics.requests.inc(labels)
    assert metrics.requests.get(labels) == 1


def test_get_reads_a_series_without_creating_it() -> None:
    metrics = RuntimeMetrics()
    forwards = {"model": "m", "lane": "text", "outcome": "ok"}
    assert metrics.forwards.get(forwards) == 0 and samples(metrics.render()) == []
    metrics.forwards.inc(forwards)
    metrics.forwards.inc(forwards, 2)
    assert metrics.forwards.get(forwards) == 3 and metrics.forwards.get({**forwards, "outcome": "error"}) == 0


def test_each_instance_has_its_own_registry() -> None:
    one, two = RuntimeMetrics(), RuntimeMetrics()
    one.errors.inc({"code": "overloaded"})
    assert one.errors.get({"code": "overloaded"}) == 1 and two.errors.get({"code": "overloaded"}) == 0
    default = {f.name for f in prometheus_client.REGISTRY.collect()}
    assert not any(name.startswith("vllm_sr") for name in default)


def test_counters_are_declared_with_their_exposed_total_name() -> None:
    with pytest.raises(ValueError, match="_total"):
        MetricsRegistry().counter("vllm_srun_things", "Things")
    registry = MetricsRegistry()
    registry.gauge("vllm_srun_x", "X", ("model",))
    with pytest.raises(ValueError, match="declared twice"):
        registry.gauge("vllm_srun_x", "X again", ("model",))


def test_the_result_cache_counts_lookups_with_its_labels() -> None:
    metrics = RuntimeMetrics()
    cache = ResultCache(4, metrics.cache)
    assert cache.get("k", "m") is None
    text = metrics.render()
    assert metric(text, "vllm_srun_result_cache_total", model="m", outcome="miss") == 1
    check_labels = {s.name: set(s.labels) for s in samples(text)}
    assert check_labels == {"vllm_srun_result_cache_total": {"model", "outcome"}}


def test_front_events_count_with_their_labels() -> None:
    metrics = FrontMetrics()
    events = FrontEvents(metrics)
    events.pool_event("d", ReplicaEjected("d/1", seconds=1.0, until=2.0, ejections_in_a_row=1))
    events.pool_event("d", ReplicaReadmitted("d/1", reason="cooldown"))
    events.pool_event("d", EjectionWithheld("d/0", reason="single_replica"))
    events.pool_event("d", ReplicaBackedOff("d/0", seconds=0.5, until=1.0))
    events.lifecycle("replica_restarted", "d", "d/0", "pid=1")
    text = metrics.render()
    assert metric(text, "vllm_sr_ejections_total", deployment="d", replica="d/1") == 1
    assert metric(text, "vllm_sr_readmissions_total", deployment="d", replica="d/1", reason="cooldown") == 1
    assert metric(text, "vllm_sr_ejections_withheld_total", deployment="d", replica="d/0", reason="single_replica") == 1
    assert metric(text, "vllm_sr_replica_backoffs_total", deployment="d", replica="d/0") == 1
    assert metric(text, "vllm_sr_replica_restarts_total", deployment="d", replica="d/0") == 1
