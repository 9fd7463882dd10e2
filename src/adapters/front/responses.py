"""Responses the front writes itself over raw ASGI: proxied answers, and errors from the one
error table (`adapters/http/errors.py`), each with Server-Timing (R-API-9)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from vllm_srun.adapters.http.errors import error_parts

Send = Callable[[dict[str, Any]], Awaitable[None]]
JSON = b"application/json"


async def send_response(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def send_error(send: Send, exc: BaseException, start: float, extra: dict[str, str] | None = None) -> None:
    """The answer to EXC (status, body and Retry-After from the table), plus EXTRA headers."""
    status, body, table_headers = error_parts(exc)
    merged = {**table_headers, **(extra or {})}
    headers = [(b"content-type", JSON)]
    headers += [(name.encode(), value.encode()) for name, value in merged.items()]
    headers.append((b"server-timing", server_timing(0.0, None, start)))
    await send_response(send, status, body, headers)


def server_timing(parse_ms: float, worker: bytes | None, start: float) -> bytes:
    """parse (the front's), queue and forward (the worker's), worker (the worker's total) and
    total (the front's) in ms."""
    queue = forward = worker_total = "0.000"
    if worker:
        for part in worker.decode("latin-1").split(","):
            name, _, dur = part.strip().partition(";dur=")
            if name == "queue":
                queue = dur
            elif name == "forward":
                forward = dur
            elif name == "total":
                worker_total = dur
    total = (time.perf_counter() - start) * 1000
    return (
        f"parse;dur={parse_ms:.3f}, queue;dur={queue}, forward;dur={forward}, "
        f"worker;dur={worker_total}, total;dur={total:.3f}"
    ).encode()
