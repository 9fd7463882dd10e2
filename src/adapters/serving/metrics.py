"""The worker's metrics (R-API-7): every `vllm_srun_*` series, declared with its label names.

Documented in docs/metrics.md (a test keeps that table and these declarations equal).
Increments happen on the event loop; the device thread only reports through the loop
(`call_soon_threadsafe`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from vllm_srun.adapters.prometheus import SECONDS_BUCKETS, MetricsRegistry
from vllm_srun.adapters.serving.package_facts import resident_weight_bytes

if TYPE_CHECKING:
    from vllm_srun.adapters.serving.served import ServedModel
    from vllm_srun.domain.scheduling.planning import ForwardBatch

ROWS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
TOKENS_BUCKETS = (8, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
RATIO_BUCKETS = (0.1, 0.25, 0.5, 0.75, 0.9, 1.0)

FORWARD = ("model", "lane")  # the labels of every per-forward series
MODEL_INFO = ("model", "revision", "family", "engine", "accelerator", "device", "profile")


class RuntimeMetrics:
    """The worker's metrics on a registry of its own."""

    def auth_refused(self, route: str, code: str) -> None:
        """One refusal at the key check (`http/auth.AuthMiddleware`'s report)."""
        self.auth_refusals.inc({"route": route, "code": code})

    def __init__(self) -> None:
        self._described: set[str] = set()  # the models `describe_models` has set the series of
        r = self.registry = MetricsRegistry()
        self.requests = r.counter(
            "vllm_srun_requests_total", "Requests answered, by model, surface and code", ("model", "surface", "code")
        )
        self.errors = r.counter("vllm_srun_errors_total", "Error responses by code", ("code",))
        # keys and tenants (R-AUTH, R-FAIR-4): never a key, a digest or a path in a label
        self.auth_refusals = r.counter(
            "vllm_srun_auth_refusals_total",
            "Requests refused at the key check, by route class (api|metrics|other) and code",
            ("route", "code"),
        )
        self.tenant_refusals = r.counter(
            "vllm_srun_tenant_refusals_total", "429 overloaded answers, by model and tenant", ("model", "tenant")
        )
        self.request_seconds = r.histogram(
            "vllm_srun_request_duration_seconds", "Request time", ("surface",), SECONDS_BUCKETS
        )
        # declared but not observed yet: its HELP and TYPE lines only
        self.queue_seconds = r.histogram(
            "vllm_srun_queue_duration_seconds", "Time before a request's first forward", ("model",), SECONDS_BUCKETS
        )
        self.forwards = r.counter(
            "vllm_srun_forwards_total", "Forwards run, by model, lane and outcome", (*FORWARD, "outcome")
        )
        self.forward_seconds = r.histogram(
            "vllm_srun_forward_duration_seconds", "Forward time", FORWARD, SECONDS_BUCKETS
        )
        self.batch_rows = r.histogram("vllm_srun_batch_rows", "Rows per forward", FORWARD, ROWS_BUCKETS)
        self.batch_tokens = r.histogram(
            "vllm_srun_batch_tokens", "Counted (padded or packed) tokens per forward", FORWARD, TOKENS_BUCKETS
        )
        self.batch_fill = r.histogram(
            "vllm_srun_batch_fill_ratio", "Real tokens / counted tokens per forward", FORWARD, RATIO_BUCKETS
        )
        self.rows = r.counter("vllm_srun_rows_total", "Rows run on a device", FORWARD)
        self.bundle_tasks = r.histogram(
            "vllm_srun_bundle_tasks", "Tasks per /v1/bundle request, by tenant", ("tenant",), ROWS_BUCKETS
        )
        self.queue_depth = r.gauge("vllm_srun_queue_depth", "Rows waiting for a forward", ("model",))
        self.ready = r.gauge("vllm_srun_ready", "1 when the model is ready", ("model",))
        # what a loaded model is (value 1) and what its weights hold; set once it is loaded (`describe_models`)
        self.model_info = r.gauge("vllm_srun_model_info", "The served model (value 1)", MODEL_INFO)
        self.model_memory = r.gauge(
            "vllm_srun_model_memory_bytes",
            "Bytes of a loaded model's weight tensors, packed and reduced-precision copies included",
            ("model",),
        )
        self.unanswered = r.gauge(
            "vllm_srun_unanswered_requests", "Requests admitted and not answered yet (--max-queue)", ("model",)
        )
        self.unanswered_tokens = r.gauge(
            "vllm_srun_unanswered_tokens",
            "Tokens (request-body bytes) of the admitted, unanswered requests (--max-queued-tokens)",
            ("model",),
        )
        self.queued_work = r.gauge(  # the per-replica autoscaling signal (deploy/kubernetes: the HPA)
            "vllm_srun_queued_work_ratio",
            "Unanswered tokens / --max-queued-tokens (1.0: new requests start getting 429)",
            ("model",),
        )
        self.cache = r.counter(
            "vllm_srun_result_cache_total", "Result cache lookups by outcome (hit|miss)", ("model", "outcome")
        )
        # media (R-MEDIA, R-PERF-4): the worker's decode cache and media workers, shared by its models
        self.media_cache = r.counter(
            "vllm_srun_media_decode_cache_total",
            "Decode cache lookups by kind (image|video) and outcome (hit|miss)",
            ("kind", "outcome"),
        )
        self.media_cache_entries = r.gauge(
            "vllm_srun_media_decode_cache_entries", "Decoded inputs kept in the cache, by kind", ("kind",)
        )
        self.media_cache_bytes = r.gauge(
            "vllm_srun_media_decode_cache_bytes", "Bytes of decoded pixels kept in the cache, by kind", ("kind",)
        )
        self.media_decode_seconds = r.histogram(
            "vllm_srun_media_decode_duration_seconds",
            "Decode and preprocess time of one input",
            ("kind",),
            SECONDS_BUCKETS,
        )
        self.media_workers_replaced = r.counter(
            "vllm_srun_media_workers_replaced_total",
            "Media worker processes replaced after they died (exited) or overran their time (timeout) holding a job",
            ("reason",),
        )
        self.cancelled_rows = r.counter(
            "vllm_srun_cancelled_requests_total",
            "Requests dropped before they finished (client went away or deadline)",
            ("model",),
        )
        self.open_connections = r.gauge(
            "vllm_srun_open_connections", "Open client connections by phase, as of the scrape", ("phase",)
        )
        self.connections_closed = r.counter(
            "vllm_srun_connections_closed_total",
            "Client connections the worker closed or refused, by reason",
            ("reason",),
        )

        self.adaptive_learned = r.gauge(
            "vllm_srun_adaptive_threads_learned",
            "Learned forward thread count of a forward-size bucket (0 until learned), R-CPU-2",
            ("model", "bucket"),
        )
        self.adaptive_shadows = r.counter(
            "vllm_srun_adaptive_shadows_total",
            "Shadow forwards of adaptive threads, by thread count and outcome (match|drift)",
            ("model", "threads", "outcome"),
        )

    def observe_forward(self, model: str, batch: ForwardBatch, seconds: float, ok: bool) -> None:
        """One forward of MODEL's scheduler loop (its `on_forward`, bound to the model's name when
        the loop starts): its outcome, time, rows, counted tokens and fill."""
        labels = {"model": model, "lane": batch.lane}
        self.forwards.inc({**labels, "outcome": "ok" if ok else "error"})
        self.forward_seconds.observe(seconds, labels)
        self.batch_rows.observe(len(batch.rows), labels)
        self.batch_tokens.observe(batch.tokens, labels)
        self.rows.inc(labels, len(batch.rows))
        if batch.tokens:
            self.batch_fill.observe(sum(r.tokens for r in batch.rows) / batch.tokens, labels)

    def describe_models(self, models: Iterable[ServedModel]) -> None:
        """`vllm_srun_model_info` and `vllm_srun_model_memory_bytes` of each loaded model (its
        weights are walked once, `package_facts.resident_weight_bytes`); a model not loaded
        (yet, or ever) has neither."""
        for served in models:
            model = served.model
            if model is None or served.name in self._described:
                continue
            facts = served.facts
            info = {
                "model": served.name,
                "revision": (facts.revision if facts is not None else None) or "local",
                "family": model.family,
                "engine": model.engine.name,
                "accelerator": model.device.kind,
                "device": model.device.name,
                "profile": served.profile_fields()["profile"],
            }
            self.model_info.set(1.0, info)
            self.model_memory.set(float(resident_weight_bytes(model)), {"model": served.name})
            self._described.add(served.name)

    def render(self) -> str:
        return self.registry.render()
