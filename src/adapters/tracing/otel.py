"""The OpenTelemetry tracer (API + SDK), imported only when tracing is on (`setup.py`).

Worker spans are made after the request was answered, from its `RequestTiming`, with the
times it recorded (perf_counter, shifted to the epoch):

    POST /v1/embeddings (server; parent: the incoming `traceparent`)
      parse       body read and decoded, model found
      admission   waiting out a Retry-After hold and being admitted (R-ADM-1)
      queue       from admission to the request's first forward (preparation + scheduler wait)
      forward     one per forward its rows ran in: srun.batch.id, srun.batch.rows, ...
      serialize   the answer encoded

One forward span per request and forward (not one shared span with links): cheap, and the batch
id says which requests shared a forward. The front's span (server) is open while the request is
proxied, and its context goes to the worker as `traceparent`/`tracestate`.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from vllm_srun.adapters.request_timing import RequestTiming
from vllm_srun.adapters.tracing.port import TRACEPARENT, TRACESTATE, FrontSpan, Headers, TracingUnavailable

SCOPE = "vllm_srun"
W3C = TraceContextTextMapPropagator()


def _carrier(headers: Sequence[tuple[bytes, bytes]]) -> dict[str, str]:
    return {
        name.decode("latin-1"): value.decode("latin-1") for name, value in headers if name in (TRACEPARENT, TRACESTATE)
    }


def parent_of(scope: Mapping[str, Any]) -> Context:
    """The context the client's (or the front's) W3C headers carry; an empty one without them."""
    return W3C.extract(_carrier(scope.get("headers", ())))


class _OpenFrontSpan:
    __slots__ = ("span",)

    def __init__(self, span: trace.Span) -> None:
        self.span = span

    def context_headers(self, scope: Mapping[str, Any]) -> Headers:
        carrier: dict[str, str] = {}
        W3C.inject(carrier, trace.set_span_in_context(self.span))
        return tuple((name.encode("latin-1"), value.encode("latin-1")) for name, value in carrier.items())

    def end(self, deployment: str, code: str, status: int) -> None:
        span = self.span
        span.set_attribute("srun.deployment", deployment)
        span.set_attribute("srun.code", code)
        if status:
            span.set_attribute("http.response.status_code", status)
        if status >= 500 or (not status and code != "ok"):
            span.set_status(Status(StatusCode.ERROR, code))
        span.end()


class OtelTracer:
    """Spans through PROVIDER's tracer."""

    enabled = True

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer(SCOPE)

    def front_request(self, scope: Mapping[str, Any]) -> FrontSpan:
        span = self.tracer.start_span(
            f"{scope.get('method', 'POST')} {scope.get('path', '')}",
            context=parent_of(scope),
            kind=SpanKind.SERVER,
            attributes={"http.request.method": scope.get("method", "POST"), "url.path": scope.get("path", "")},
        )
        return _OpenFrontSpan(span)

    def worker_request(self, scope: Mapping[str, Any], timing: RequestTiming) -> None:
        shift = time.time_ns() - time.perf_counter_ns()  # perf_counter → epoch ns, taken now

        def ns(t: float) -> int:
            return int(t * 1e9) + shift

        now = time.perf_counter()
        request = self.tracer.start_span(
            f"{scope.get('method', 'POST')} {scope.get('path', '')}",
            context=parent_of(scope),
            kind=SpanKind.SERVER,
            start_time=ns(timing.start),
            attributes={"http.request.method": scope.get("method", "POST"), "url.path": scope.get("path", "")},
        )
        if timing.status:
            request.set_attribute("http.response.status_code", timing.status)
        if timing.model:
            request.set_attribute("srun.model", timing.model)
        if timing.status >= 500:
            request.set_status(Status(StatusCode.ERROR))
        if request.is_recording():  # the sampler kept it
            self._stages(request, timing, ns)
        request.end(end_time=ns(now))

    def _stages(self, request: trace.Span, timing: RequestTiming, ns: Any) -> None:
        inside = trace.set_span_in_context(request)
        tracer = self.tracer

        def span(name: str, start: float, end: float, attributes: dict[str, Any] | None = None) -> None:
            tracer.start_span(name, context=inside, start_time=ns(start), attributes=attributes).end(end_time=ns(end))

        parsed = timing.start + timing.parse_ms / 1000
        if timing.parse_ms:
            span("parse", timing.start, parsed)
        if timing.admitted:
            span("admission", parsed, timing.admitted)
        forwards = timing.forwards or []
        if forwards:
            span(
                "queue",
                timing.admitted or parsed,
                forwards[0].start,
                {"srun.queue.scheduler_ms": round(timing.queue_ms, 3), "srun.forwards": len(forwards)},
            )
        for record in forwards:
            attributes = {
                "srun.batch.id": record.batch_id,
                "srun.batch.rows": record.rows,
                "srun.batch.requests": record.requests,
                "srun.batch.tokens": record.tokens,
                "srun.lane": record.lane,
            }
            if not record.ok:
                attributes["srun.batch.failed"] = True
            span("forward", record.start, record.end, attributes)
        if timing.encode_end:
            span("serialize", timing.encode_start, timing.encode_end)

    def shutdown(self) -> None:
        self.provider.shutdown()


def resource_for(env: Mapping[str, str], service: str) -> Resource:
    """SERVICE (unless `OTEL_SERVICE_NAME` or `OTEL_RESOURCE_ATTRIBUTES` names one), the host and
    the process id (which worker ran a request), merged with what `OTEL_RESOURCE_ATTRIBUTES` says."""
    named = env.get("OTEL_SERVICE_NAME") or "service.name=" in env.get("OTEL_RESOURCE_ATTRIBUTES", "")
    attributes: dict[str, Any] = {"host.name": socket.gethostname(), "process.pid": os.getpid()}
    if not named:
        attributes["service.name"] = service
    return Resource.create(attributes)  # reads OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES itself


def otlp_exporter(env: Mapping[str, str]) -> SpanExporter:
    """The OTLP exporter of `OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL` (default http/protobuf, as the
    specification says); it reads its endpoint, headers and timeout from the `OTEL_EXPORTER_OTLP_*`
    variables itself."""
    protocol = (
        env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf"
    )
    try:
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc

            return Grpc()
        if protocol == "http/protobuf":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http

            return Http()
    except ImportError as exc:
        raise TracingUnavailable(
            f"OTEL_TRACES_EXPORTER=otlp needs opentelemetry-exporter-otlp ({exc.name} is missing: "
            "pip install 'vllm-srun[tracing]')"
        ) from None
    raise TracingUnavailable(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol}: this build sends grpc or http/protobuf")


def tracer_for(exporters: Sequence[str], env: Mapping[str, str], service: str) -> OtelTracer:
    """A tracer exporting to EXPORTERS (`console`, `otlp`) in batches off the serving path; the
    sampler is the SDK's (`OTEL_TRACES_SAMPLER`, `OTEL_TRACES_SAMPLER_ARG`), the batching too
    (`OTEL_BSP_*`)."""
    chosen = [ConsoleSpanExporter() if name == "console" else otlp_exporter(env) for name in exporters]
    return tracer_with([BatchSpanProcessor(exporter) for exporter in chosen], resource_for(env, service))


def tracer_with(processors: Sequence[SpanProcessor], resource: Resource | None = None) -> OtelTracer:
    """A tracer over PROCESSORS (tests: a SimpleSpanProcessor over an InMemorySpanExporter)."""
    provider = TracerProvider(resource=resource or Resource.create({}), shutdown_on_exit=True)
    for processor in processors:
        provider.add_span_processor(processor)
    return OtelTracer(provider)
