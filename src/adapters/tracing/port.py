"""The tracing port: what the front and the worker ask of a tracer, and the no-op one they use by
default (tracing off). Nothing here imports OpenTelemetry.

The worker records a request's spans after the fact from its `RequestTiming` (parse, admission,
queue, forward, serialize: the time points the HTTP adapter and the scheduler loop fill in), so
the serving path gains no instrumentation calls; the front opens one span per request and hands
its context to the worker as W3C `traceparent`/`tracestate` headers. Off, the front still passes
a client's `traceparent`/`tracestate` through to the worker unchanged, and the no-op costs one
attribute read per request and no allocation.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from vllm_srun.adapters.request_timing import RequestTiming

TRACEPARENT = b"traceparent"
TRACESTATE = b"tracestate"
Headers = tuple[tuple[bytes, bytes], ...]
NO_HEADERS: Headers = ()


class TracingUnavailable(ValueError):
    """An `OTEL_*` setting this install cannot honour (one line: the CLIs refuse to start with it)."""


def incoming_trace_headers(headers: Iterable[tuple[bytes, bytes]]) -> Headers:
    """The W3C trace context among HEADERS (an ASGI scope's: lower-case names), as sent."""
    found = NO_HEADERS
    for name, value in headers:
        if name in (TRACEPARENT, TRACESTATE):
            found += ((name, value),)
    return found


class FrontSpan(Protocol):
    """One request's span at the front, open while it is proxied."""

    def context_headers(self, scope: Mapping[str, Any]) -> Headers:
        """The trace context the worker continues (`traceparent`, `tracestate`)."""
        ...

    def end(self, deployment: str, code: str, status: int) -> None:
        """Close it: the deployment it went to, its outcome code (`ok` or an error code) and HTTP status
        (0: none was sent, e.g. the client went away)."""
        ...


class Tracer(Protocol):
    """What the HTTP adapters ask of tracing. `enabled` False: nothing is recorded, and callers may
    skip the calls (the worker's middleware does)."""

    enabled: bool

    def front_request(self, scope: Mapping[str, Any]) -> FrontSpan:
        """The span of one request arriving at the front (its parent: the client's `traceparent`)."""
        ...

    def worker_request(self, scope: Mapping[str, Any], timing: RequestTiming) -> None:
        """Record one answered worker request from its TIMING (its parent: the `traceparent` the
        front or the client sent)."""
        ...

    def shutdown(self) -> None:
        """Flush what is buffered (at process exit)."""
        ...


class _PassThrough:
    """The no-op front span: the client's trace context goes on to the worker as it came."""

    __slots__ = ()

    def context_headers(self, scope: Mapping[str, Any]) -> Headers:
        return incoming_trace_headers(scope.get("headers", NO_HEADERS))

    def end(self, deployment: str, code: str, status: int) -> None:
        return None


PASS_THROUGH = _PassThrough()


class NoopTracer:
    """Tracing off: records nothing, allocates nothing."""

    __slots__ = ()
    enabled = False

    def front_request(self, scope: Mapping[str, Any]) -> FrontSpan:
        return PASS_THROUGH

    def worker_request(self, scope: Mapping[str, Any], timing: RequestTiming) -> None:
        return None

    def shutdown(self) -> None:
        return None


NOOP = NoopTracer()
