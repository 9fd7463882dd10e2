"""The worker's HTTP app (litestar + msgspec): surfaces, models, health, metrics, OpenAPI.

Handlers decode bodies with decoders built once (unknown fields refused), hand the request to
its surface, and encode the answer. Every error leaves through `_error` with one table.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import msgspec
from litestar import Litestar, Request, Response, get, post
from litestar.exceptions import HTTPException

from vllm_srun.adapters.http.errors import RETRY_AFTER_SECONDS, decode_error_message, status_for
from vllm_srun.adapters.http.openapi import openapi_document
from vllm_srun.adapters.http.timing import SCOPE_KEY, ServerTimingMiddleware, Timing
from vllm_srun.adapters.serving.runtime import Runtime
from vllm_srun.adapters.serving.served import ServedModel
from vllm_srun.adapters.http.content_encoding import decode_body
from vllm_srun.adapters.surfaces import decisions as decision_surfaces
from vllm_srun.adapters.surfaces.classify import classify as classify_surface
from vllm_srun.adapters.surfaces.embeddings import embeddings as embeddings_surface
from vllm_srun.adapters.surfaces.rerank import rerank as rerank_surface
from vllm_srun.domain.errors import DomainError, InvalidRequest
from vllm_srun.adapters.http.errors import ErrorBody, ErrorResponse
from vllm_srun.adapters.schemas.common import json_encoder
from vllm_srun.adapters.schemas.decisions import DecisionsBatchRequest, DecisionsBatchResponse, DecisionsRequest, DecisionsResponse, batch_decoder, decisions_decoder
from vllm_srun.adapters.schemas.embeddings import EmbeddingsRequest, EmbeddingsResponse, embeddings_decoder
from vllm_srun.adapters.schemas.encoder import ClassifyRequest, ClassifyResponse, RerankRequest, RerankResponse, classify_decoder, rerank_decoder

log = logging.getLogger("vllm_srun.http")
JSON = "application/json"
DEFAULT_MAX_REQUEST_BYTES = 8 * 1024 * 1024

# a surface: (served model, decoded request, timing, disconnect watcher factory) -> response
SurfaceFn = Callable[[ServedModel, Any, Timing, Callable[[], Awaitable[Any]]], Awaitable[msgspec.Struct]]


@dataclass(frozen=True)
class SurfaceRoute:
    path: str
    surface: str
    decoder: msgspec.json.Decoder
    handler: Callable[..., Awaitable[msgspec.Struct]]
    request_type: type
    response_type: type


SURFACE_ROUTES: list[SurfaceRoute] = [
    SurfaceRoute("/v1/embeddings", "embeddings", embeddings_decoder, embeddings_surface, EmbeddingsRequest, EmbeddingsResponse),
    SurfaceRoute("/v1/classify", "classify", classify_decoder, classify_surface, ClassifyRequest, ClassifyResponse),
    # Jina and the Cohere v1 client post to /v1/rerank, the Cohere v2 client (ClientV2) to /v2/rerank
    SurfaceRoute("/v1/rerank", "rerank", rerank_decoder, rerank_surface, RerankRequest, RerankResponse),
    SurfaceRoute("/v2/rerank", "rerank", rerank_decoder, rerank_surface, RerankRequest, RerankResponse),
    # decision models (R-API-4): /v1/systemone is the path the typesafe-sdk client posts to
    SurfaceRoute("/v1/decisions", "decisions", decisions_decoder, decision_surfaces.decisions, DecisionsRequest, DecisionsResponse),
    SurfaceRoute("/v1/systemone", "systemone", decisions_decoder, decision_surfaces.systemone, DecisionsRequest, DecisionsResponse),
    SurfaceRoute("/v1/systemone/batches", "systemone_batches", batch_decoder, decision_surfaces.systemone_batches,
                 DecisionsBatchRequest, DecisionsBatchResponse),
]


def register_surface(route: SurfaceRoute) -> None:
    SURFACE_ROUTES.append(route)


def _error(code: str, message: str) -> Response:
    headers = {}
    if code in RETRY_AFTER_SECONDS:
        headers["retry-after"] = str(RETRY_AFTER_SECONDS[code])
    body = json_encoder.encode(ErrorResponse(ErrorBody(code, message)))
    return Response(content=body, status_code=status_for(code), media_type=JSON, headers=headers)


async def _wait_disconnect(receive: Callable[[], Awaitable[dict]]) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


def _surface_handler(route: SurfaceRoute):  # type: ignore[no-untyped-def]
    async def handle(request: Request) -> Response:
        runtime: Runtime = request.app.state.runtime
        timing: Timing = request.scope[SCOPE_KEY]  # type: ignore[literal-required]
        model_label = "-"
        code = "ok"
        try:
            body = await request.body()
            if "content-encoding" in request.headers:  # e.g. typesafe-sdk's zstd bodies
                limit = getattr(request.app.state, "max_request_bytes", DEFAULT_MAX_REQUEST_BYTES)
                body = decode_body(body, request.headers.get("content-encoding"), limit)
            try:
                req = route.decoder.decode(body)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                raise InvalidRequest(decode_error_message(exc)) from None
            served = runtime.get(getattr(req, "model", None))
            model_label = served.name
            timing.parse_ms = (time.perf_counter() - timing.start) * 1000
            result = await route.handler(served, req, timing, lambda: _wait_disconnect(request.receive))
            return Response(content=json_encoder.encode(result), media_type=JSON)
        except DomainError as exc:
            code = exc.code
            if code == "client_closed_request":
                log.info("499 %s: client went away, its queued rows were dropped", route.path)
                runtime.metrics.cancelled_rows.inc({"model": model_label})
            return _error(code, exc.message)
        except HTTPException as exc:
            code = _code_for_http(exc.status_code)
            return _error(code, _http_message(exc))
        except Exception:  # never a stack trace in the body
            code = "internal_error"
            log.exception("internal error on %s", route.path)
            return _error(code, "internal error; see the server log")
        finally:
            runtime.metrics.requests.inc({"model": model_label, "surface": route.surface, "code": code})
            if code != "ok":
                runtime.metrics.errors.inc({"code": code})
            runtime.metrics.request_seconds.observe(time.perf_counter() - timing.start, {"surface": route.surface})

    handle.__name__ = "surface_" + route.path.strip("/").replace("/", "_")
    return post(route.path, status_code=200)(handle)


def _code_for_http(status: int) -> str:
    return {404: "not_found", 405: "method_not_allowed", 413: "request_too_large", 503: "not_ready"}.get(
        status, "invalid_request" if 400 <= status < 500 else "internal_error"
    )


def _http_message(exc: HTTPException) -> str:
    if exc.status_code == 413:
        return "request body is larger than --max-request-bytes"
    return str(exc.detail or exc.__class__.__name__).splitlines()[0]


def _on_http_exception(request: Request, exc: Exception) -> Response:
    if isinstance(exc, HTTPException):
        return _error(_code_for_http(exc.status_code), _http_message(exc))
    log.exception("internal error on %s", request.url.path)
    return _error("internal_error", "internal error; see the server log")


@get("/v1/models")
async def list_models(request: Request) -> Response:
    runtime: Runtime = request.app.state.runtime
    body = {"object": "list", "data": [m.card() for m in runtime.models.values()]}
    return Response(content=msgspec.json.encode(body), media_type=JSON)


@get("/health")
async def health(request: Request) -> Response:
    runtime: Runtime = request.app.state.runtime
    ready, body = runtime.health()
    headers = {} if ready else {"retry-after": str(RETRY_AFTER_SECONDS["not_ready"])}
    return Response(content=msgspec.json.encode(body), status_code=200 if ready else 503, media_type=JSON, headers=headers)


@get("/health/live")
async def live() -> Response:
    return Response(content=b'{"status":"alive"}', media_type=JSON)


@get("/metrics")
async def metrics(request: Request) -> Response:
    runtime: Runtime = request.app.state.runtime
    return Response(content=runtime.metrics.render().encode(), media_type="text/plain; version=0.0.4; charset=utf-8")


@get("/openapi.json")
async def openapi() -> Response:
    return Response(content=msgspec.json.encode(openapi_document(SURFACE_ROUTES)), media_type=JSON)


def create_app(runtime: Runtime, *, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES, load_on_startup: bool = True) -> Litestar:
    async def on_startup(app: Litestar) -> None:
        if load_on_startup:
            import asyncio

            runtime.start_loading(asyncio.get_running_loop())

    async def on_shutdown(app: Litestar) -> None:
        await runtime.stop()

    handlers = [_surface_handler(r) for r in SURFACE_ROUTES] + [list_models, health, live, metrics, openapi]
    app = Litestar(
        route_handlers=handlers,
        middleware=[ServerTimingMiddleware],
        exception_handlers={Exception: _on_http_exception},
        on_startup=[on_startup],
        on_shutdown=[on_shutdown],
        request_max_body_size=max_request_bytes,
        openapi_config=None,
        debug=False,
        logging_config=None,
    )
    app.state.runtime = runtime
    app.state.max_request_bytes = max_request_bytes
    return app
