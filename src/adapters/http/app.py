"""The worker's HTTP app (litestar + msgspec): surfaces, models, health, metrics, OpenAPI.

Handlers read and decode bodies the way the front does (`request_body.py`: size, content
encoding, JSON limits; decoders built once, unknown fields refused), build the request's `Call`
(`adapters/call.py`: tenant, body size, disconnect, timing, model), admit it to its model
(R-ADM-1, before any tokenizing), hand it to its surface (`surfaces/registry.py`:
`surface(served, request, call)`) or to the bundle (`surfaces/bundle.py`), and encode the answer. A large body is decoded, prepared and
answered off the event loop (`adapters/offload.py`). Errors leave through litestar's exception
handlers, which use the one error table (`errors.py`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

import msgspec
from litestar import Litestar, Request, Response, get, post
from litestar.handlers import HTTPRouteHandler
from litestar.middleware import DefineMiddleware

from vllm_srun.adapters.call import Call
from vllm_srun.adapters.cancellation import wait_disconnect
from vllm_srun.adapters.http.auth import Authenticator, AuthMiddleware, tenant_of
from vllm_srun.adapters.http.errors import JSON, code_of, exception_handlers, status_for
from vllm_srun.adapters.http.liveness import live
from vllm_srun.adapters.http.multipart import as_json, is_multipart
from vllm_srun.adapters.http.openapi import YAML, openapi_json, openapi_yaml
from vllm_srun.adapters.http.request_body import (
    content_encoding,
    content_type,
    decode_request,
    decompress,
    inflated_size,
    read_body,
)
from vllm_srun.adapters.http.timing import ServerTimingMiddleware
from vllm_srun.adapters.model_card import model_card
from vllm_srun.adapters.offload import TRIM_BYTES, Offload
from vllm_srun.adapters.prometheus import CONTENT_TYPE
from vllm_srun.adapters.request_timing import timing_of
from vllm_srun.adapters.schemas.common import API_VERSION, json_encoder
from vllm_srun.adapters.schemas.models_list import ProcessLimits, models_list
from vllm_srun.adapters.schemas.routes import BUNDLE_PATH, SURFACE_SCHEMAS
from vllm_srun.adapters.serving.metrics import RuntimeMetrics
from vllm_srun.adapters.serving.runtime import Runtime
from vllm_srun.adapters.surfaces.admission import admission_tokens
from vllm_srun.adapters.surfaces.bundle import bundle
from vllm_srun.adapters.surfaces.registry import SURFACE_ROUTES, SurfaceRoute
from vllm_srun.adapters.tracing.port import NOOP, Tracer
from vllm_srun.domain.errors import Cancelled, NotReady, Overloaded
from vllm_srun.domain.scheduling.admission import RetryDiscipline
from vllm_srun.domain.settings import bounds

log = logging.getLogger("vllm_srun.http")


class Body:
    """A request's body as sent (possibly compressed, or multipart), until WORK decodes it."""

    __slots__ = ("encoding", "kind", "limit", "raw", "size")

    def __init__(self, raw: bytes, encoding: str | None, limit: int, size: int, kind: str | None = None) -> None:
        self.raw = raw
        self.encoding = encoding
        self.limit = limit
        self.size = size  # at most what it inflates to: where it is decoded
        self.kind = kind  # its Content-Type

    async def decode(self, offload: Offload, decoder: msgspec.json.Decoder[Any]) -> tuple[Any, int]:
        """The request Struct and the plain body's size (R-ADM-1 counts it), decoded off the
        event loop when the body is large or compressed; the bytes are let go once decoded."""
        raw, self.raw = self.raw, b""
        return await offload.hand_off(_decode, decoder, raw, self.encoding, self.limit, self.kind, size=self.size)


def _decode(
    decoder: msgspec.json.Decoder[Any], body: bytes, encoding: str | None, limit: int, kind: str | None = None
) -> tuple[Any, int]:
    """BODY inflated (a multipart body made the JSON it stands for), then decoded and held to the
    JSON limits (`request_body.py`)."""
    if encoding is not None:
        body = decompress(body, encoding, limit)
    if is_multipart(kind):
        assert kind is not None
        body = as_json(body, kind)
    return decode_request(decoder, body, None, limit), len(body)


@dataclass(frozen=True, slots=True)
class Posted:
    """A POST as its route's WORK gets it: the body as sent (WORK decodes it), the request's
    `Call` as far as the transport tells (tenant, body size, disconnect, timing; WORK adds the
    model), and the TCP peer it came from (None over a Unix socket)."""

    body: Body
    call: Call
    peer: object


# what a POST route does once its body is read: the answer
Work = Callable[[Posted], Awaitable[msgspec.Struct]]


def _post_handler(
    path: str, surface: str, metrics: RuntimeMetrics, offload: Offload, max_request_bytes: int, work: Work
) -> HTTPRouteHandler:
    """A POST route: read the body, build the request's `Call`, run WORK (which decodes it),
    encode the answer; count every request (by the model WORK resolved, `RequestTiming.model`);
    release the memory a large one freed."""

    async def handle(request: Request[Any, Any, Any]) -> Response[bytes]:
        timing = timing_of(request.scope)
        code = "ok"
        size = 0
        try:
            raw = await read_body(request.scope, request.receive, max_request_bytes)
            encoding = content_encoding(request.scope)  # e.g. typesafe-sdk's zstd bodies
            size = inflated_size(len(raw), encoding, max_request_bytes)  # a small compressed body may inflate
            body = Body(raw, encoding, max_request_bytes, size, content_type(request.scope))
            del raw
            call = Call(
                tenant=tenant_of(request.scope),
                body_bytes=size,  # the surfaces prepare a large request off the loop
                disconnected=lambda: wait_disconnect(request.receive),
                timing=timing,
            )
            result = await work(Posted(body, call, _tcp_peer(request.scope)))
            timing.encode_start = time.perf_counter()
            content = await offload.hand_off(json_encoder.encode, result, size=size)
            timing.encode_end = time.perf_counter()
            return Response(content=content, media_type=JSON)
        except BaseException as exc:  # answered by the exception handlers; counted here
            code = code_of(exc) if not isinstance(exc, asyncio.CancelledError) else "client_closed_request"
            if isinstance(exc, Cancelled):
                log.info("499 %s: client went away, its queued rows were dropped", path)
                metrics.cancelled_rows.inc({"model": timing.model or "-"})
            raise
        finally:
            metrics.requests.inc({"model": timing.model or "-", "surface": surface, "code": code})
            if code != "ok":
                metrics.errors.inc({"code": code})
            metrics.request_seconds.observe(time.perf_counter() - timing.start, {"surface": surface})
            if size >= TRIM_BYTES:
                offload.release_memory()  # what its preparation and answer freed goes back to the OS

    handle.__name__ = "surface_" + path.strip("/").replace("/", "_")
    return post(path, status_code=200)(handle)


def _tcp_peer(scope: Any) -> object:
    """The TCP connection a request came on ((host, port)); None over a Unix socket, where the
    front's pooled connections carry many clients' requests."""
    client = scope.get("client")
    return tuple(client) if client else None


def _surface_handler(
    route: SurfaceRoute,
    runtime: Runtime,
    metrics: RuntimeMetrics,
    offload: Offload,
    max_request_bytes: int,
    discipline: RetryDiscipline,
    clock: Callable[[], float],
) -> HTTPRouteHandler:
    async def work(posted: Posted) -> msgspec.Struct:
        req, plain_bytes = await posted.body.decode(offload, route.decoder)
        served = runtime.get(req.model)
        call, peer = replace(posted.call, model=served.name), posted.peer
        timing = call.timing
        assert timing is not None
        timing.model = served.name
        timing.parse_ms = (time.perf_counter() - timing.start) * 1000
        if peer is not None and (wait := discipline.wait_s(peer, clock())) > 0:
            await asyncio.sleep(wait)  # it asked again before its Retry-After: it waits that out here
        try:
            tokens = admission_tokens(served, req, plain_bytes)
            with served.admitted(call, 1, tokens) as admitted:  # R-ADM-1, R-FAIR-1
                timing.admitted = time.perf_counter()
                return await route.handler(served, req, admitted)
        except Overloaded as refusal:
            metrics.tenant_refusals.inc({"model": served.name, "tenant": call.tenant})  # R-FAIR-4
            if peer is not None:
                discipline.refused(peer, clock(), refusal.retry_after_s)
            raise

    return _post_handler(route.path, route.surface, metrics, offload, max_request_bytes, work)


def _bundle_handler(
    runtime: Runtime, metrics: RuntimeMetrics, offload: Offload, max_request_bytes: int, max_bundle_tasks: int
) -> HTTPRouteHandler:
    """POST /v1/bundle (R-PERF-1): each model's tasks are admitted and run as one unit."""
    schema = next(s for s in SURFACE_SCHEMAS if s.path == BUNDLE_PATH)

    async def work(posted: Posted) -> msgspec.Struct:
        call = posted.call  # a bundle's tasks are admitted in `surfaces/bundle.py`, for its tenant
        req, _ = await posted.body.decode(offload, schema.decoder)  # the same body decoding and JSON limits
        if call.timing is not None:
            call.timing.parse_ms = (time.perf_counter() - call.timing.start) * 1000
        metrics.bundle_tasks.observe(len(req.tasks), {"tenant": call.tenant})
        return await bundle(
            runtime.get,
            req,
            call,
            max_tasks=max_bundle_tasks,
            status_of=status_for,
            refused=lambda model: metrics.tenant_refusals.inc({"model": model, "tenant": call.tenant}),
        )

    return _post_handler(schema.path, schema.surface, metrics, offload, max_request_bytes, work)


@get("/v1/models")
async def list_models(request: Request[Any, Any, Any]) -> Response[bytes]:
    runtime: Runtime = request.app.state.runtime
    body = models_list([model_card(m) for m in runtime.models.values()], request.app.state.process_limits)
    return Response(content=msgspec.json.encode(body), media_type=JSON)


@get("/health")
async def health(request: Request[Any, Any, Any]) -> Response[bytes]:
    runtime: Runtime = request.app.state.runtime
    ready, body = runtime.health()
    body = {"api_version": API_VERSION, **body}  # `schemas/health.Health`
    headers = {} if ready else {"retry-after": str(NotReady.default_retry_after_s)}
    return Response(
        content=msgspec.json.encode(body), status_code=200 if ready else 503, media_type=JSON, headers=headers
    )


@get("/metrics")
async def metrics(request: Request[Any, Any, Any]) -> Response[bytes]:
    registry: RuntimeMetrics = request.app.state.metrics
    runtime: Runtime = request.app.state.runtime
    registry.describe_models(runtime.models.values())  # vllm_srun_model_info of the models loaded since
    return Response(content=registry.render().encode(), headers={"content-type": CONTENT_TYPE})


@get("/openapi.json")
async def openapi() -> Response[bytes]:
    return Response(content=openapi_json(), media_type=JSON)


@get("/openapi.yaml")
async def openapi_yaml_route() -> Response[bytes]:
    """The same document as YAML (as the upstream runtime serves its contract)."""
    return Response(content=openapi_yaml(), media_type=YAML)


def create_app(
    runtime: Runtime,
    *,
    runtime_metrics: RuntimeMetrics,
    offload: Offload,
    max_request_bytes: int,
    max_bundle_tasks: int = bounds.MAX_BUNDLE_TASKS.default,
    load_on_startup: bool = True,
    clock: Callable[[], float] = time.monotonic,
    auth: Authenticator | None = None,
    tracer: Tracer = NOOP,
) -> Litestar:
    """The worker's app over RUNTIME: its requests counted in RUNTIME_METRICS (also what
    `/metrics` renders), large bodies decoded and answers encoded on OFFLOAD. CLOCK (seconds,
    monotonic) times the holds of clients that retry before their Retry-After
    (`RetryDiscipline`); tests pass one they advance. AUTH (`http/auth.py`) checks every
    request's key before anything else runs; without one no key is asked for. TRACER
    (`adapters/tracing`; default off) records each answered request's spans."""

    async def on_startup(app: Litestar) -> None:
        if load_on_startup:
            runtime.start_loading(asyncio.get_running_loop())

    async def on_shutdown(app: Litestar) -> None:
        await runtime.stop()

    discipline = RetryDiscipline()
    handlers = [
        _surface_handler(r, runtime, runtime_metrics, offload, max_request_bytes, discipline, clock)
        for r in SURFACE_ROUTES
    ]
    handlers.append(_bundle_handler(runtime, runtime_metrics, offload, max_request_bytes, max_bundle_tasks))
    app = Litestar(
        route_handlers=[*handlers, list_models, health, live, metrics, openapi, openapi_yaml_route],
        middleware=[  # outermost first: a request without a good key goes no further
            DefineMiddleware(
                AuthMiddleware,  # type: ignore[arg-type]  # raw ASGI, as below
                authenticator=auth or Authenticator(),
                on_refusal=runtime_metrics.auth_refused,
            ),
            DefineMiddleware(ServerTimingMiddleware, tracer=tracer),  # type: ignore[arg-type]  # raw ASGI, as above
        ],
        exception_handlers=exception_handlers(),
        on_startup=[on_startup],
        on_shutdown=[on_shutdown],
        request_max_body_size=max_request_bytes,
        openapi_config=None,
        debug=False,
        logging_config=None,
    )
    app.state.runtime = runtime
    app.state.metrics = runtime_metrics
    app.state.process_limits = ProcessLimits(max_bundle_tasks, max_request_bytes)
    return app
