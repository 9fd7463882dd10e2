"""Server-Timing (parse, tokenize, queue, forward, post, serialize, total in ms: the phases of
`request_timing`) on every response, errors included; and, when tracing is on, the request's
spans once it is answered (`adapters/tracing`)."""

from __future__ import annotations

import logging
from typing import Any

from vllm_srun.adapters.request_timing import SCOPE_KEY, RequestTiming
from vllm_srun.adapters.tracing.port import NOOP, Tracer

log = logging.getLogger("vllm_srun.http")


class ServerTimingMiddleware:
    """Raw ASGI middleware: creates the request's timing and appends the header on the way out;
    TRACER (default: off) records a POST request (the surfaces) from its timing after the answer
    went out."""

    def __init__(self, app: Any, tracer: Tracer = NOOP) -> None:
        self.app = app
        self.tracer = tracer

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        timing = RequestTiming()
        scope[SCOPE_KEY] = timing

        async def send_with_timing(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                timing.status = message["status"]
                headers = list(message.get("headers", []))
                headers.append((b"server-timing", timing.header().encode()))
                message = {**message, "headers": headers}
            await send(message)

        if not self.tracer.enabled or scope["method"] != "POST":  # health probes and scrapes are not traced
            await self.app(scope, receive, send_with_timing)
            return
        timing.forwards = []
        try:
            await self.app(scope, receive, send_with_timing)
        finally:
            try:
                self.tracer.worker_request(scope, timing)
            except Exception:  # tracing never fails a request
                log.exception("tracing: the spans of %s were not recorded", scope.get("path"))
