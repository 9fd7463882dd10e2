"""The one error table (R-API-9): domain error codes → HTTP status, plus Retry-After where due.

Every error body is `{"error": {"code", "message"}}`; never a stack trace.
"""

from __future__ import annotations

from msgspec import Struct

STATUS_BY_CODE: dict[str, int] = {
    "invalid_request": 400,
    "max_length_exceeded": 400,
    "question_failed": 400,
    "not_found": 404,
    "model_not_found": 404,
    "method_not_allowed": 405,
    "request_too_large": 413,
    "unsupported_surface": 422,
    "overloaded": 429,
    "client_closed_request": 499,
    "internal_error": 500,
    "worker_failed": 502,  # the front: the replica died or broke the connection mid-request
    "not_ready": 503,
    "deadline_exceeded": 504,
}

RETRY_AFTER_SECONDS: dict[str, int] = {"overloaded": 1, "not_ready": 5}


def status_for(code: str) -> int:
    return STATUS_BY_CODE.get(code, 500)


def decode_error_message(exc: Exception) -> str:
    """A one-line message for a msgspec decode/validation error."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:300]


class ErrorBody(Struct):
    code: str
    message: str


class ErrorResponse(Struct):
    error: ErrorBody
