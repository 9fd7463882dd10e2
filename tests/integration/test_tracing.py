"""Tracing end to end in-process (docs/tracing.md): a worker's spans (parse, admission, queue,
forward with its batch id and rows, serialize) continue the trace its `traceparent` names, two
requests that shared a forward carry its batch id; the front hands the worker its own span's
context (tracing on) or the client's as it came (off)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.fake_worker import FakeWorker
from tests.integration.serving import serving
from tests.integration.test_fake_family import fake_container, fake_package  # noqa: F401  # the fixture
from tests.waiting import until, wait_until
from vllm_srun.adapters.config.loader import load_config_data
from vllm_srun.adapters.readiness.golden import LoadTimeChecks
from vllm_srun.adapters.tracing.otel import OtelTracer, tracer_with
from vllm_srun.adapters.tracing.port import NOOP
from vllm_srun.app.bootstrap import bootstrap_front
from vllm_srun.domain.settings.engine_args import EngineArgs

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"
STAGES = ("parse", "admission", "queue", "forward", "serialize")


def in_memory() -> tuple[OtelTracer, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    return tracer_with([SimpleSpanProcessor(exporter)]), exporter


def of_trace(spans: Sequence[ReadableSpan], trace_id: int) -> list[ReadableSpan]:
    return [s for s in spans if s.context is not None and s.context.trace_id == trace_id]


class NotInvariant(LoadTimeChecks):
    """The probe finds the model not batch-invariant, so the batch window applies (R-BAT-4/5)."""

    def probe(self, model: Any) -> bool | None:
        return False


def test_a_worker_request_continues_the_incoming_trace_with_its_stages(fake_package: Path) -> None:  # noqa: F811
    tracer, exporter = in_memory()
    with serving(fake_container(fake_package, adapters={"tracer": tracer})) as (client, _rt):
        answer = client.post(
            "/v1/embeddings", json={"input": ["the cat", "a dog"]}, headers={"traceparent": TRACEPARENT}
        )
        assert answer.status_code == 200
        spans = wait_until(
            lambda: of_trace(exporter.get_finished_spans(), int(TRACE_ID, 16)), what="the request's spans"
        )
    request = next(s for s in spans if s.name == "POST /v1/embeddings")
    assert request.parent is not None and request.parent.span_id == int(CLIENT_SPAN, 16)
    assert request.attributes is not None and request.attributes["http.response.status_code"] == 200
    stages = {s.name: s for s in spans if s is not request}
    assert set(stages) == set(STAGES)
    for stage in stages.values():
        assert stage.parent is not None and stage.parent.span_id == request.context.span_id
        assert stage.start_time is not None and stage.end_time is not None
        assert request.start_time <= stage.start_time <= stage.end_time <= request.end_time  # type: ignore[operator]
    order = [stages[name].start_time for name in STAGES]
    assert order == sorted(order)  # type: ignore[type-var]
    forward = stages["forward"].attributes
    assert forward is not None and forward["srun.batch.rows"] == 2 and forward["srun.batch.requests"] == 1
    assert isinstance(forward["srun.batch.id"], int) and forward["srun.batch.tokens"] > 0


def test_requests_that_shared_a_forward_carry_its_batch_id(fake_package: Path) -> None:  # noqa: F811
    tracer, exporter = in_memory()
    container = fake_container(  # profile batching: the two requests' rows may share a forward
        [(fake_package, EngineArgs(profile="batching", batch_window_ms=400))],  # type: ignore[list-item]
        adapters={"tracer": tracer, "readiness": NotInvariant()},
    )
    parents = [f"00-{n:032x}-{CLIENT_SPAN}-01" for n in (1, 2)]
    with serving(container) as (client, _rt):
        answers: list[int] = []

        def post(parent: str) -> None:
            answer = client.post("/v1/embeddings", json={"input": [parent]}, headers={"traceparent": parent})
            answers.append(answer.status_code)

        threads = [threading.Thread(target=post, args=(p,)) for p in parents]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert answers == [200, 200]

        def forwards() -> list[ReadableSpan]:
            found = [s for s in exporter.get_finished_spans() if s.name == "forward"]
            return found if len(found) == 2 else []

        spans = wait_until(forwards, what="one forward span per request")
    assert {s.context.trace_id for s in spans} == {1, 2}  # one per request, each in its own trace
    ids = {s.attributes["srun.batch.id"] for s in spans}  # type: ignore[index]
    assert len(ids) == 1, "the two requests ran in different forwards"
    for span in spans:
        assert span.attributes is not None and span.attributes["srun.batch.requests"] == 2
        assert span.attributes["srun.batch.rows"] == 2


class HeadRecorder:
    """A TCP relay in front of a fake worker that keeps the head of each request it passes on."""

    def __init__(self, target: FakeWorker) -> None:
        self.target = target
        self.heads: list[dict[str, str]] = []
        self.port = 0

    async def start(self) -> HeadRecorder:
        server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        return self

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def posts(self) -> list[dict[str, str]]:
        return [h for h in self.heads if h[":request"].startswith("POST")]

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target.port)

        async def down() -> None:
            while data := await up_reader.read(65536):
                writer.write(data)
                await writer.drain()
            writer.close()

        back = asyncio.ensure_future(down())
        buffered, body_left = b"", 0
        try:
            while data := await reader.read(65536):
                buffered += data
                while True:
                    skipped = min(body_left, len(buffered))  # the body of the last head
                    buffered, body_left = buffered[skipped:], body_left - skipped
                    if body_left or b"\r\n\r\n" not in buffered:
                        break
                    head, _, buffered = buffered.partition(b"\r\n\r\n")
                    lines = head.decode("latin-1").split("\r\n")
                    fields = {k.lower(): v for k, v in (line.split(": ", 1) for line in lines[1:] if ": " in line)}
                    self.heads.append({":request": lines[0], **fields})
                    body_left = int(fields.get("content-length", "0"))
                up_writer.write(data)
                await up_writer.drain()
        finally:
            up_writer.close()
            back.cancel()


async def _front_post(tracer: Any, headers: dict[str, str]) -> tuple[HeadRecorder, httpx.Response, Any]:
    worker = await FakeWorker(model="fake-a").start()
    relay = await HeadRecorder(worker).start()
    replicas = [{"endpoint": relay.endpoint, "model": worker.model}]
    deployments = {"primary": {"artifact": "fake-artifact", "replicas": replicas, "result_cache_entries": 0}}
    config = load_config_data({"global": {"model_catalog": {"deployments": deployments}}})
    container = bootstrap_front(config, socket_dir="/nonexistent", max_request_bytes=1 << 20, tracer=tracer)
    fleet = container.fleet()
    app = container.app()
    await fleet.start()
    try:
        await until(lambda: fleet.deployments["primary"].ready_count() == 1, what="the replica ready")
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://front") as client:
            answer = await client.post("/v1/embeddings", json={"model": "primary", "input": "hi"}, headers=headers)
        await until(lambda: relay.posts(), what="the request at the worker")
    finally:
        await fleet.stop(grace_s=1)
        await worker.stop()
    return relay, answer, container


def test_tracing_off_the_front_passes_the_clients_context_on() -> None:
    async def go() -> None:
        headers = {"traceparent": TRACEPARENT, "tracestate": "vendor=1"}
        relay, answer, _ = await _front_post(NOOP, headers)
        assert answer.status_code == 200
        head = relay.posts()[-1]
        assert head["traceparent"] == TRACEPARENT and head["tracestate"] == "vendor=1"

    asyncio.run(asyncio.wait_for(go(), 60))


def test_tracing_on_the_worker_continues_the_fronts_span() -> None:
    tracer, exporter = in_memory()

    async def go() -> None:
        relay, answer, _ = await _front_post(tracer, {"traceparent": TRACEPARENT, "tracestate": "vendor=1"})
        assert answer.status_code == 200
        head = relay.posts()[-1]
        (front,) = wait_until(lambda: exporter.get_finished_spans(), what="the front's span")
        assert front.context is not None and front.parent is not None
        assert front.context.trace_id == int(TRACE_ID, 16) and front.parent.span_id == int(CLIENT_SPAN, 16)
        assert head["traceparent"] == f"00-{TRACE_ID}-{front.context.span_id:016x}-01"
        assert head["tracestate"] == "vendor=1"
        assert front.attributes is not None and front.attributes["srun.deployment"] == "primary"
        assert front.attributes["http.response.status_code"] == 200

    asyncio.run(asyncio.wait_for(go(), 60))


def test_a_request_without_a_traceparent_starts_a_trace_at_the_front() -> None:
    tracer, exporter = in_memory()

    async def go() -> None:
        relay, answer, _ = await _front_post(tracer, {})
        assert answer.status_code == 200
        (front,) = wait_until(lambda: exporter.get_finished_spans(), what="the front's span")
        assert front.parent is None and front.context is not None
        _version, trace_id, parent, _flags = relay.posts()[-1]["traceparent"].split("-")
        assert (trace_id, parent) == (f"{front.context.trace_id:032x}", f"{front.context.span_id:016x}")

    asyncio.run(asyncio.wait_for(go(), 60))
