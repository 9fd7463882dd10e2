"""Server-Timing (parse, queue, forward, total in ms) on every response, errors included."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass(slots=True)
class Timing:
    start: float = field(default_factory=time.perf_counter)
    parse_ms: float = 0.0
    queue_ms: float = 0.0
    forward_ms: float = 0.0

    def header(self) -> str:
        total = (time.perf_counter() - self.start) * 1000
        return (
            f"parse;dur={self.parse_ms:.3f}, queue;dur={self.queue_ms:.3f}, "
            f"forward;dur={self.forward_ms:.3f}, total;dur={total:.3f}"
        )


SCOPE_KEY = "srun_timing"


class ServerTimingMiddleware:
    """Raw ASGI middleware: creates the request's Timing and appends the header on the way out."""

    def __init__(self, app) -> None:  # type: ignore[no-untyped-def]
        self.app = app

    async def __call__(self, scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        timing = Timing()
        scope[SCOPE_KEY] = timing

        async def send_with_timing(message) -> None:  # type: ignore[no-untyped-def]
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers.append((b"server-timing", timing.header().encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_timing)
