"""Domain errors. Each carries a stable code; the HTTP adapter's one error table maps codes to
status codes (R-API-9). Nothing here knows about HTTP.

Messages go back to clients, so they never hold a filesystem path (`without_paths`; the log keeps
the full text) and never echo a client's value whole (`quoted` cuts it).
"""

from __future__ import annotations

import re

ECHO_LIMIT = 64  # characters of a client's value an error message repeats
_PATH = re.compile(r"(?<![\w.:/~-])(?:~|\.{1,2})?(?:/[^\s/'\"`,;:()\[\]{}<>|]+)+/?")


class DomainError(Exception):
    code = "internal_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidRequest(DomainError):
    code = "invalid_request"


class RequestTooLarge(DomainError):
    code = "request_too_large"


class ModelNotFound(DomainError):
    code = "model_not_found"


class UnsupportedSurface(DomainError):
    code = "unsupported_surface"


class RetryLater(DomainError):
    """An error the client should retry: it says after how many seconds (`Retry-After`)."""

    default_retry_after_s = 1

    def __init__(self, message: str, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = self.default_retry_after_s if retry_after_s is None else retry_after_s


class Overloaded(RetryLater):
    code = "overloaded"
    default_retry_after_s = 1


class NotReady(RetryLater):
    code = "not_ready"
    default_retry_after_s = 5


class DeadlineExceeded(DomainError):
    code = "deadline_exceeded"


class Cancelled(DomainError):
    code = "client_closed_request"


class ForwardFailed(DomainError):
    code = "internal_error"


class MaxLengthExceeded(DomainError):
    code = "max_length_exceeded"


class MediaFailed(DomainError):
    """Decoding a request's media failed for a reason of the server's (a media worker died):
    only that request fails; the message says which input and that it may be retried."""

    code = "internal_error"


class RequestTimeout(DomainError):
    """The request head or body did not arrive within its timeout (the connection closes)."""

    code = "request_timeout"


def quoted(value: object, limit: int = ECHO_LIMIT) -> str:
    """VALUE as a message repeats it: its repr, cut to LIMIT characters (`…` and the full length after)."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text)} characters)"


def without_paths(text: str) -> str:
    """TEXT with every absolute or home-relative filesystem path replaced by its last part
    (`/srv/models/m/model.safetensors` → `model.safetensors`), or by `<path>` for a folder."""

    def last_part(match: re.Match[str]) -> str:
        name = match.group(0).rstrip("/").rsplit("/", 1)[-1]
        return name if name and not match.group(0).endswith("/") else "<path>"

    return _PATH.sub(last_part, text)
