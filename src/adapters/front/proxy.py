"""The front's hot path: any POST surface, proxied to one replica of a deployment (R-REP-3).

Raw ASGI rather than a framework handler, because the front may add at most about a
millisecond (`bench/front_overhead.py`). Per request:
1. read and decode the body exactly as a worker does (`http/request_body.py`: 413 over
   `--max-request-bytes`, content encodings, JSON limits; a large body off the event loop),
   refuse while draining (503); the worker gets the plain (inflated) body;
2. pick the deployment from `model` (the only one when omitted), then the front result cache
   (single-worker deployments);
3. `Pool.pick` with the body's size: 429 `overloaded` / 503 `not_ready` with Retry-After;
4. send it with the deadline `min(timeout_ms, options.deadline_ms)`, watching the client:
   an answer → its outcome; the deadline → 504 `deadline_exceeded` (outcome `timeout`); the
   worker gone → 502 `worker_failed` at once (outcome `failed`); the client gone → 499 logged
   (outcome `cancelled`). Giving up on a request closes its worker connection, so the worker
   drops its queued rows. A replica that could not even be connected to (`WorkerUnreachable`:
   refused, no route, no handshake within a second) never saw the request: it counts as
   `failed` for that replica, and the request goes to another replica (each at most once,
   within the same deadline); 502 only when none is left;
5. the tenant the key check found (`http/auth.py`) goes to the worker as `x-vllm-srun-tenant`
   where the worker takes it (its Unix socket, or a replica with the internal token; R-AUTH-3);
6. `Pool.release` exactly once per pick, whatever happened; its events go to logs, metrics and
   probes. A replica that failed or timed out also drops its idle connections, so a host
   that went away is reached again through fresh connections (and a fresh name lookup);
7. the W3C trace context goes to the worker (`traceparent`, `tracestate`): the front's span's
   when tracing is on, else the client's as it came (`adapters/tracing`, docs/tracing.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from vllm_srun.adapters.cancellation import race, wait_disconnect
from vllm_srun.adapters.front import bodies
from vllm_srun.adapters.front.fleet import Deployment, Fleet
from vllm_srun.adapters.front.inventory import deployment_for
from vllm_srun.adapters.front.metrics import FrontMetrics
from vllm_srun.adapters.front.responses import send_error, send_response, server_timing
from vllm_srun.adapters.http.auth import TENANT_HEADER, tenant_of
from vllm_srun.adapters.http.errors import status_for
from vllm_srun.adapters.http.request_body import (
    content_encoding,
    content_type,
    decode_document,
    inflated_size,
    read_body,
)
from vllm_srun.adapters.offload import TRIM_BYTES, Offload
from vllm_srun.adapters.tracing.port import NOOP, Headers, Tracer
from vllm_srun.adapters.workers.http_client import WorkerResponse, WorkerUnavailable, WorkerUnreachable
from vllm_srun.domain.errors import (
    Cancelled,
    DeadlineExceeded,
    DomainError,
    NotReady,
)
from vllm_srun.domain.fleet.replicas import Outcome
from vllm_srun.domain.scheduling.tenants import DEFAULT_TENANT

log = logging.getLogger("vllm_srun.front")
REFUSED_CODES = frozenset({"overloaded", "http_429"})  # the front's own 429 and a worker's
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class WorkerFailed(DomainError):
    code = "worker_failed"


class Draining(NotReady):
    """The front is shutting down (SIGTERM): 503 with `Connection: close`."""


def _without_tenant(named: tuple[tuple[bytes, bytes], ...]) -> tuple[tuple[bytes, bytes], ...]:
    """NAMED less the tenant header, for a replica that does not take it (the trace context stays)."""
    return tuple(header for header in named if header[0] != TENANT_HEADER)


def outcome_of(status: int) -> Outcome:
    """What a worker's answer means for the pool."""
    if status == 504:
        return Outcome.TIMEOUT
    if status in (429, 503):
        return Outcome.REJECTED
    if status >= 500:
        return Outcome.FAILED
    return Outcome.OK


class Proxy:
    def __init__(
        self,
        fleet: Fleet,
        metrics: FrontMetrics,
        *,
        max_request_bytes: int,
        clock: Callable[[], float] = time.monotonic,
        offload: Offload | None = None,
        tracer: Tracer = NOOP,
    ) -> None:
        self.fleet = fleet
        self.tracer = tracer
        self.offload = offload if offload is not None else Offload(1)
        self.metrics = metrics
        self.max_request_bytes = max_request_bytes
        self.clock = clock
        self.draining = False
        self.active = 0

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        start = time.perf_counter()
        self.active += 1
        label, code = "-", "ok"
        size = status = 0
        span = self.tracer.front_request(scope)
        try:
            body = await read_body(scope, receive, self.max_request_bytes)
            if self.draining:
                raise Draining("the front is shutting down; retry on another instance")
            encoding = content_encoding(scope)
            size = inflated_size(len(body), encoding, self.max_request_bytes)  # a small compressed body may inflate
            kind = content_type(scope)  # a multipart body (typesafe-sdk's media assets) goes on as JSON
            doc, body = await self.offload.hand_off(
                decode_document, body, encoding, self.max_request_bytes, kind, size=size
            )
            deployment = deployment_for(self.fleet, bodies.requested_model(doc, scope["path"]))
            label = deployment.name
            parse_ms = (time.perf_counter() - start) * 1000
            tenant = tenant_of(scope)
            named: Headers = () if tenant == DEFAULT_TENANT else ((TENANT_HEADER, tenant.encode()),)
            named += span.context_headers(scope)
            status, payload, headers, timing = await self._serve(scope["path"], doc, body, deployment, receive, named)
            headers.append((b"server-timing", server_timing(parse_ms, timing, start)))
            code = "ok" if status < 400 else f"http_{status}"
            await send_response(send, status, payload, headers)
        except DomainError as exc:
            code, status = exc.code, status_for(exc.code)
            if isinstance(exc, Cancelled):
                log.info("499 %s: the client went away; the worker dropped its queued rows", scope["path"])
                return
            await send_error(send, exc, start, {"connection": "close"} if isinstance(exc, Draining) else None)
        except Exception as exc:
            code, status = "internal_error", 500
            log.exception("internal error on %s", scope.get("path"))
            await send_error(send, exc, start)
        finally:
            self.active -= 1
            span.end(label, code, status)
            if size >= TRIM_BYTES:
                self.offload.release_memory()
            self.metrics.requests.inc({"deployment": label, "code": code})
            if code != "ok":
                self.metrics.errors.inc({"code": code})
            if code in REFUSED_CODES:  # R-FAIR-4: whose requests were turned away
                self.metrics.tenant_refusals.inc({"deployment": label, "tenant": tenant_of(scope)})
            self.metrics.request_seconds.observe(time.perf_counter() - start, {"deployment": label})

    async def _serve(
        self,
        path: str,
        doc: dict[str, Any],
        body: bytes,
        deployment: Deployment,
        receive: Receive,
        named: tuple[tuple[bytes, bytes], ...] = (),
    ) -> tuple[int, bytes, list[tuple[bytes, bytes]], bytes | None]:
        """(status, body, headers, the worker's Server-Timing) of one request."""
        cache = deployment.cache
        key = None
        if cache is not None and cache.enabled and not bodies.wants_meta(doc, path):
            key = await self.offload.hand_off(bodies.cache_key, path, doc, size=len(body))
            hit = cache.get(key)
            self.metrics.cache.inc({"deployment": deployment.name, "outcome": "miss" if hit is None else "hit"})
            if hit is not None:
                return 200, hit, [(b"content-type", b"application/json")], None
        timeout = deployment.timeout_s
        asked = bodies.deadline_ms(doc)
        if asked is not None:
            timeout = min(timeout, asked / 1000.0)
        response, worker_model = await self._dispatch(path, doc, body, deployment, timeout, receive, named)
        payload = bodies.for_client(response.body, deployment.answered_as(worker_model), deployment.public_id, path)
        if key is not None and response.status == 200 and cache is not None:
            cache.put(key, payload, weight=len(payload))
        headers = [(b"content-type", response.headers.get(b"content-type", b"application/json"))]
        retry = response.headers.get(b"retry-after")
        if retry is not None:
            headers.append((b"retry-after", retry))
        return response.status, payload, headers, response.headers.get(b"server-timing")

    async def _dispatch(
        self,
        path: str,
        doc: dict[str, Any],
        body: bytes,
        deployment: Deployment,
        timeout: float,
        receive: Receive,
        named: tuple[tuple[bytes, bytes], ...] = (),
    ) -> tuple[WorkerResponse, str | None]:
        deadline = self.clock() + timeout
        replica_id = deployment.pool.pick(len(body), self.clock())  # Overloaded / NotReady carry retry_after_s
        tried = [replica_id]
        while True:
            try:
                return await self._send(path, doc, body, deployment, replica_id, (deadline, timeout), receive, named)
            except WorkerUnreachable as exc:
                failed = WorkerFailed(f"replica {replica_id} failed: {exc}")
                if self.clock() >= deadline:
                    raise failed from None
                try:  # never sent: another replica may take it, else the 502 stands
                    replica_id = deployment.pool.pick(len(body), self.clock(), exclude=tried)
                except DomainError:
                    raise failed from None
                tried.append(replica_id)
                log.debug("%s unreachable (%s); sending the request to %s", tried[-2], exc, replica_id)

    async def _send(
        self,
        path: str,
        doc: dict[str, Any],
        body: bytes,
        deployment: Deployment,
        replica_id: str,
        budget: tuple[float, float],
        receive: Receive,
        named: tuple[tuple[bytes, bytes], ...] = (),
    ) -> tuple[WorkerResponse, str | None]:
        """One try on the picked replica until the deadline (`budget`: the deadline and the
        request's whole timeout), released exactly once; raises WorkerUnreachable when the
        replica could not be connected to."""
        deadline, budget_s = budget
        pool = deployment.pool
        size = len(body)
        handle = deployment.handles[replica_id]
        outcome = Outcome.FAILED
        broken = False  # the connection failed or was given up: the replica's idle ones go too
        sent_at = self.clock()
        payload = bodies.for_worker(doc, body, handle.worker_model, handle.attached, path)  # no await before `try`
        headers = named if handle.client.names_tenants or not named else _without_tenant(named)
        try:
            response = await race(
                lambda: handle.client.request("POST", path, payload, headers=headers),
                deadline_s=max(0.0, deadline - sent_at),
                disconnected=lambda: wait_disconnect(receive),
                deadline_message=f"no answer within {budget_s * 1000:g} ms (timeout_ms or options.deadline_ms)",
            )
            outcome = outcome_of(response.status)
            if response.status == 503:
                handle.probe_now()
            return response, handle.worker_model
        except DeadlineExceeded:  # the worker connection was closed: the worker drops the rows
            outcome, broken = Outcome.TIMEOUT, True
            raise
        except Cancelled:
            outcome = Outcome.CANCELLED
            raise
        except WorkerUnreachable:
            outcome, broken = Outcome.FAILED, True
            raise
        except WorkerUnavailable as exc:
            outcome, broken = Outcome.FAILED, True
            raise WorkerFailed(f"replica {replica_id} failed: {exc}") from None
        except asyncio.CancelledError:
            outcome = Outcome.CANCELLED
            raise
        finally:
            if broken:
                handle.client.close_idle()
            events = pool.release(replica_id, outcome, self.clock(), request_bytes=size, started_at=sent_at)
            self.metrics.outcomes.inc({"deployment": deployment.name, "replica": replica_id, "outcome": outcome.value})
            if events:
                self.fleet.pool_events(deployment, events)
