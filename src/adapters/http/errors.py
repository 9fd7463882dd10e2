"""The one error table (R-API-9): exception → `{"error": {"code", "message"}}`, HTTP status and
headers, for the worker's app and the front alike.

- a `DomainError` carries its code and message; `RetryLater` errors (overloaded, not ready)
  carry the seconds that go into `Retry-After`;
- a framework `HTTPException` (unknown route, method, body over the limit) maps by status: the
  codes are the upstream contract's, so an unknown route (404) and a method a route does not
  take (405) keep their status and answer `invalid_request` (the contract has no code of their
  own: the request is malformed, the status says how);
- anything else is a 500 `internal_error` whose body never holds a stack trace (it is logged).

`error_parts(exc)` is the mapping; `exception_handlers()` plugs it into litestar (keyed by
exception type) and the front's raw-ASGI proxy sends the same parts itself.
"""

from __future__ import annotations

import logging
from typing import Any

from litestar import Request, Response
from litestar.exceptions import HTTPException
from litestar.types import ExceptionHandlersMap
from msgspec import Struct
from uvicorn.protocols.http.httptools_impl import STATUS_LINE

from vllm_srun.adapters.schemas.common import json_encoder
from vllm_srun.domain.errors import DomainError, NotReady, Overloaded, RetryLater
from vllm_srun.domain.security.key_guessing import TooManyWrongKeys

log = logging.getLogger("vllm_srun.http")
JSON = "application/json"

STATUS_BY_CODE: dict[str, int] = {
    "invalid_request": 400,
    "max_length_exceeded": 400,
    "unauthorized": 401,  # no API key, or a wrong one (R-AUTH-1)
    "model_not_found": 404,
    "request_timeout": 408,  # the connection guard: a head or body that did not arrive in time
    "request_too_large": 413,
    "unsupported_surface": 422,
    "overloaded": 429,
    "too_many_wrong_keys": 429,  # R-AUTH-2
    "headers_too_large": 431,
    "client_closed_request": 499,
    "internal_error": 500,
    "worker_failed": 502,  # the front: the replica died or broke the connection mid-request
    "not_ready": 503,
    "too_many_connections": 503,
    "deadline_exceeded": 504,
}
CODE_BY_HTTP_STATUS: dict[int, str] = {
    413: "request_too_large",
    503: "not_ready",
}
INTERNAL_MESSAGE = "internal error; see the server log"
RETRY_LATER: dict[str, type[RetryLater]] = {cls.code: cls for cls in (Overloaded, NotReady, TooManyWrongKeys)}


class ErrorBody(Struct):
    code: str
    message: str


class ErrorResponse(Struct):
    error: ErrorBody


def status_for(code: str) -> int:
    return STATUS_BY_CODE.get(code, 500)


def decode_error_message(exc: Exception) -> str:
    """A one-line message for a msgspec decode/validation error."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:300]


def code_of(exc: BaseException) -> str:
    """The error code an exception answers with."""
    if isinstance(exc, DomainError):
        return exc.code
    if isinstance(exc, HTTPException):
        status = exc.status_code
        return CODE_BY_HTTP_STATUS.get(status, "invalid_request" if 400 <= status < 500 else "internal_error")
    return "internal_error"


def _message(exc: BaseException) -> str:
    if isinstance(exc, DomainError):
        return exc.message
    if isinstance(exc, HTTPException):
        if exc.status_code == 413:
            return "request body is larger than --max-request-bytes"
        if exc.status_code == 404:
            return "no such route (GET /openapi.json lists them)"
        if exc.status_code == 405:
            return "this route does not take this method (GET /openapi.json lists them)"
        return str(exc.detail or type(exc).__name__).splitlines()[0]
    return INTERNAL_MESSAGE


def error_body(code: str, message: str) -> bytes:
    return json_encoder.encode(ErrorResponse(ErrorBody(code, message)))


def error_parts(exc: BaseException) -> tuple[int, bytes, dict[str, str]]:
    """(status, JSON body, headers) of the answer to EXC."""
    code = code_of(exc)
    headers: dict[str, str] = {}
    if isinstance(exc, RetryLater):
        headers["retry-after"] = str(exc.retry_after_s)
    elif code in RETRY_LATER:  # e.g. a framework 503
        headers["retry-after"] = str(RETRY_LATER[code].default_retry_after_s)
    return status_of(exc, code), error_body(code, _message(exc)), headers


def status_of(exc: BaseException, code: str) -> int:
    """The HTTP status of the answer to EXC (answering CODE): a framework 4xx keeps its own
    (404 unknown route, 405 method: `invalid_request` is 400 otherwise)."""
    if isinstance(exc, HTTPException) and code == "invalid_request" and 400 <= exc.status_code < 500:
        return exc.status_code
    return status_for(code)


def raw_error_response(code: str, message: str, *extra: bytes) -> bytes:
    """A complete HTTP/1.1 error response that closes the connection, for answers written
    below the application (the connection guard): status from the table, JSON body."""
    body = error_body(code, message)
    head = [
        STATUS_LINE[status_for(code)],
        b"content-type: application/json\r\n",
        b"content-length: %d\r\n" % len(body),
        b"connection: close\r\n",
        b"server-timing: total;dur=0.000\r\n",
        *extra,
        b"\r\n",
    ]
    return b"".join(head) + body


def error_response(exc: BaseException) -> Response[bytes]:
    status, body, headers = error_parts(exc)
    return Response(content=body, status_code=status, media_type=JSON, headers=headers)


def _handle(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
    if code_of(exc) == "internal_error" and not isinstance(exc, DomainError):
        log.error("internal error on %s", request.url.path, exc_info=exc)
    return error_response(exc)


def exception_handlers() -> ExceptionHandlersMap:
    """litestar's `exception_handlers`, keyed by exception type."""
    return {DomainError: _handle, HTTPException: _handle, Exception: _handle}
