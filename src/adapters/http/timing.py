"""Server-Timing (parse, queue, forward, total in ms) on every response, errors included."""

from __future__ import annotations

from typing import Any

from vllm_srun.adapters.request_timing import SCOPE_KEY, RequestTiming


class ServerTimingMiddleware:
    """Raw ASGI middleware: creates the request's timing and appends the header on the way out."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        timing = RequestTiming()
        scope[SCOPE_KEY] = timing

        async def send_with_timing(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers.append((b"server-timing", timing.header().encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_timing)
