"""The front's HTTP app: every POST goes to the proxy (any surface path, R-REP-3); the rest is a
litestar app with the reports: `/v1/models`, `/health`, `/health/live`, `/metrics`,
`/api/v1/inventory`, `/openapi.json`."""

from __future__ import annotations

import logging
import time
from typing import Any

import msgspec
from litestar import Litestar, Request, Response, get

from vllm_srun.adapters.front.fleet import Fleet
from vllm_srun.adapters.front.inventory import deployment_card, health, inventory
from vllm_srun.adapters.front.metrics import FrontMetrics
from vllm_srun.adapters.front.proxy import Proxy
from vllm_srun.adapters.front.reconfigure import Reconfigurer
from vllm_srun.adapters.http.auth import Authenticator, AuthMiddleware
from vllm_srun.adapters.http.errors import exception_handlers
from vllm_srun.adapters.http.liveness import live  # the same liveness answer as a worker's
from vllm_srun.adapters.http.openapi import openapi_document
from vllm_srun.adapters.http.timing import ServerTimingMiddleware
from vllm_srun.adapters.prometheus import CONTENT_TYPE
from vllm_srun.adapters.schemas.models_list import ProcessLimits, models_list
from vllm_srun.domain.errors import NotReady
from vllm_srun.domain.settings import bounds

log = logging.getLogger("vllm_srun.front")
JSON = "application/json"


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(content=msgspec.json.encode(body), status_code=status, media_type=JSON, headers=headers or {})


@get("/v1/models")
async def list_models(request: Request) -> Response:
    fleet: Fleet = request.app.state.fleet
    proxy: Proxy = request.app.state.proxy
    # what one request to the front may hold: its own body limit, and the workers' bundle limit
    # (deployments do not set one: their workers keep the default)
    limits = ProcessLimits(bounds.MAX_BUNDLE_TASKS.default, proxy.max_request_bytes)
    return _json(models_list([deployment_card(d) for d in fleet.deployments.values()], limits))


@get("/health")
async def front_health(request: Request) -> Response:
    ready, body = health(request.app.state.fleet, draining=request.app.state.proxy.draining)
    headers = {} if ready else {"retry-after": str(NotReady.default_retry_after_s)}
    return _json(body, 200 if ready else 503, headers)


@get("/api/v1/inventory")
async def front_inventory(request: Request) -> Response:
    proxy: Proxy = request.app.state.proxy
    reconfigurer: Reconfigurer | None = request.app.state.reconfigurer
    reload = reconfigurer.status.describe() if reconfigurer is not None else None
    return _json(inventory(request.app.state.fleet, proxy.clock(), draining=proxy.draining, reload=reload))


@get("/metrics")
async def front_metrics(request: Request) -> Response:
    fleet: Fleet = request.app.state.fleet
    front: FrontMetrics = request.app.state.metrics
    now = time.monotonic()
    for deployment in fleet.deployments.values():
        front.ready_replicas.set(float(deployment.ready_count()), {"deployment": deployment.name})
        for status in deployment.pool.inventory(now):
            labels = {"deployment": deployment.name, "replica": status.id}
            front.in_flight.set(float(status.in_flight), labels)
            front.outstanding.set(float(status.outstanding_bytes), labels)
            front.replica_ready.set(1.0 if status.ready else 0.0, labels)
    for supervisor in fleet.retiring.values():  # retired, finishing what it holds: out of dispatch
        record = supervisor.handle.record
        labels = {"deployment": supervisor.handle.deployment, "replica": record.id}
        front.in_flight.set(float(record.in_flight), labels)
        front.outstanding.set(float(record.outstanding_bytes), labels)
        front.replica_ready.set(0.0, labels)
    # the exact header: litestar would append a second charset to a text/ media type
    return Response(content=front.render().encode(), headers={"content-type": CONTENT_TYPE})


@get("/openapi.json")
async def openapi() -> Response:
    return _json(openapi_document())  # the workers' surfaces, same schemas


class FrontApp:
    """ASGI: the key check (`http/auth.py`, AUTH; none asked for without one) first, then POST →
    the proxy, everything else (and lifespan) → the litestar app."""

    def __init__(
        self,
        fleet: Fleet,
        proxy: Proxy,
        metrics: FrontMetrics,
        reconfigurer: Reconfigurer | None = None,
        auth: Authenticator | None = None,
    ) -> None:
        self.proxy = proxy
        self.guarded = AuthMiddleware(self._route, auth or Authenticator(), metrics.auth_refused)
        self.reports = Litestar(
            route_handlers=[list_models, front_health, live, front_inventory, front_metrics, openapi],
            middleware=[ServerTimingMiddleware],  # type: ignore[list-item]  # litestar types a middleware's scope as its TypedDicts; ours is raw ASGI (a plain dict)
            exception_handlers=exception_handlers(),
            openapi_config=None,
            debug=False,
            logging_config=None,
        )
        self.reports.state.fleet = fleet
        self.reports.state.proxy = proxy
        self.reports.state.metrics = metrics
        self.reports.state.reconfigurer = reconfigurer

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        await self.guarded(scope, receive, send)

    async def _route(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            await self.proxy(scope, receive, send)
        else:
            await self.reports(scope, receive, send)  # type: ignore[arg-type]  # litestar types the ASGI scope as TypedDicts; the server's is a plain dict
