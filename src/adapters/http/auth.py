"""API keys at the door (R-AUTH-1, R-AUTH-2, R-AUTH-3): raw ASGI, outermost, so a request without a
good key is answered from its head alone: no body read, no parse, no forward.

Who a request is:
- `/health` and `/health/live` (and `/metrics` unless `metrics_open` is off) need no key;
- `Authorization: Bearer KEY` (what the openai, cohere and typesafe-sdk clients send for
  `api_key=`): a key of the key file → its tenant;
- the deployment's internal token as the key → the front speaking: the tenant it names in
  `x-vllm-srun-tenant` (else `default`). Over a Unix socket (0600 in a 0700 folder: only this
  user reaches it) the front's tenant header is taken without a token. Anywhere else a request
  that names a tenant is refused (400): a client cannot choose its tenant, its key does;
- no key file and no token: no key is asked for; the tenant is `default`.

Refusals: 401 `unauthorized` with `WWW-Authenticate: Bearer` (no key, or a wrong one); after too
many wrong keys from one connection or address (`domain/security/key_guessing.py`), 429
`too_many_wrong_keys` with `Retry-After`, before the key is even looked at. Nothing here logs,
echoes or counts a key or a digest; the `Authorization` header is removed from the scope before
the app sees it.

The tenant goes to the app in the ASGI scope under `TENANT_SCOPE_KEY`. Every refusal is reported
to the middleware's `on_refusal(route class, code)` (`/metrics`: by route class, `route_class`,
never by path or key).
"""

from __future__ import annotations

import hmac
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from vllm_srun.adapters.http.errors import error_parts
from vllm_srun.adapters.http.read_pacing import CONNECTION_SCOPE_KEY, PacedConnection
from vllm_srun.domain.errors import DomainError, InvalidRequest
from vllm_srun.domain.scheduling.tenants import DEFAULT_TENANT
from vllm_srun.domain.security.api_keys import TENANT_NAME, KeyTable, Unauthorized, key_digest
from vllm_srun.domain.security.key_guessing import GuessLimits, TooManyWrongKeys, WrongKeyLimiter

log = logging.getLogger("vllm_srun.auth")
TENANT_SCOPE_KEY = "srun_tenant"  # the request's tenant, for the runtime (beside `srun_timing`)
TENANT_HEADER = b"x-vllm-srun-tenant"  # front -> worker only
AUTHORIZATION = b"authorization"
OPEN_PATHS = frozenset({"/health", "/health/live"})
METRICS_PATH = "/metrics"
WARN_EVERY_S = 10.0
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[dict[str, Any], Receive, Send], Awaitable[None]]


class Authenticator:
    """Decides who a request is from its head (see the module docstring)."""

    def __init__(
        self,
        keys: Callable[[], KeyTable] | None = None,
        internal_token: str | None = None,
        *,
        metrics_open: bool = True,
        limits: GuessLimits | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.keys = keys
        self._token = key_digest(internal_token) if internal_token else None
        self.open_paths = OPEN_PATHS | {METRICS_PATH} if metrics_open else OPEN_PATHS
        self.limiter = WrongKeyLimiter(limits)
        self.clock = clock
        self._last_warning = -math.inf

    @property
    def required(self) -> bool:
        """Whether requests need a key (a key file or an internal token is set)."""
        return self.keys is not None or self._token is not None

    def tenant(self, scope: dict[str, Any]) -> str:
        """The tenant of the request of SCOPE; raises Unauthorized, TooManyWrongKeys or
        InvalidRequest (a tenant named by someone other than the front)."""
        return self.identify(scope)[0]

    def identify(self, scope: dict[str, Any]) -> tuple[str, bool]:
        """`tenant`, and whether the client's own key named it (so the connection is that
        tenant's, R-FAIR-5) rather than the front, an open path or no key at all."""
        if scope["path"] in self.open_paths:
            return DEFAULT_TENANT, False
        named, authorization = _headers(scope)
        peer = scope.get("client")
        over_unix = not peer  # no TCP peer: our own 0600 Unix socket
        if not self.required:
            if named is not None and not over_unix:
                raise InvalidRequest(_NAMED)
            return (_tenant_name(named) if named is not None else DEFAULT_TENANT), False
        connection = (peer[0], peer[1]) if peer else None
        address = peer[0] if peer else None
        now = self.clock()
        wait = self.limiter.retry_after_s(connection, address, now)
        if wait is not None:
            raise TooManyWrongKeys(f"too many wrong API keys from this client; retry after {wait} s", wait)
        key = _bearer(authorization)
        if key is None:
            raise Unauthorized(
                "this server needs an API key: send 'Authorization: Bearer KEY'"
                if authorization is None
                else "the Authorization header must be 'Bearer KEY'"
            )
        digest = key_digest(key)
        if self._token is not None and hmac.compare_digest(digest, self._token):
            return (_tenant_name(named) if named is not None else DEFAULT_TENANT), False
        tenant = self.keys().tenant_of(key) if self.keys is not None else None
        if tenant is None:
            self.limiter.failed(connection, address, now)
            self._warn_if_slowed(connection, address, now)
            raise Unauthorized("invalid API key")
        if named is not None and not over_unix:
            raise InvalidRequest(_NAMED)
        return tenant, True

    def _warn_if_slowed(self, connection: object, address: str | None, now: float) -> None:
        if self.limiter.retry_after_s(connection, address, now) is None or now - self._last_warning < WARN_EVERY_S:
            return
        self._last_warning = now
        log.warning("wrong API keys from %s: its requests get 429 for a while", address or "a Unix socket client")


_NAMED = "x-vllm-srun-tenant: only the front names a tenant; a client's tenant is its key's"


def _headers(scope: dict[str, Any]) -> tuple[bytes | None, list[bytes] | None]:
    """The tenant header and the Authorization values, the latter removed from SCOPE."""
    named: bytes | None = None
    authorization: list[bytes] | None = None
    kept = []
    for name, value in scope["headers"]:
        if name == AUTHORIZATION:
            authorization = [*(authorization or ()), value]
            continue
        if name == TENANT_HEADER:
            named = value
        kept.append((name, value))
    if authorization is not None:
        scope["headers"] = kept
    return named, authorization


def _bearer(values: list[bytes] | None) -> bytes | None:
    """The key of a single `Authorization: Bearer KEY` header, else None."""
    if values is None or len(values) != 1:
        return None
    scheme, _, key = values[0].strip().partition(b" ")
    key = key.strip()
    if scheme.lower() != b"bearer" or not key:
        return None
    return key


def _tenant_name(value: bytes) -> str:
    text = value.decode("latin-1").strip()
    if not TENANT_NAME.fullmatch(text):
        raise InvalidRequest("x-vllm-srun-tenant: not a tenant name")
    return text


Refused = Callable[[str, str], None]  # (route class, error code) of one refusal


def route_class(path: str) -> str:
    """The class of PATH a refusal is counted under: `metrics`, `api` (`/v1/…`) or `other`; a
    handful of values whatever a client sends."""
    if path == METRICS_PATH:
        return "metrics"
    return "api" if path.startswith("/v1/") else "other"


class AuthMiddleware:
    """Raw ASGI: `Authenticator.tenant` on every HTTP request before the app sees it; each
    refusal is reported to ON_REFUSAL (route class, code)."""

    def __init__(self, app: ASGIApp, authenticator: Authenticator, on_refusal: Refused | None = None) -> None:
        self.app = app
        self.authenticator = authenticator
        self.on_refusal = on_refusal

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        try:
            tenant, by_key = self.authenticator.identify(scope)
        except DomainError as refusal:
            if self.on_refusal is not None:
                self.on_refusal(route_class(scope["path"]), refusal.code)
            await send_refusal(send, refusal, start)
            return
        scope[TENANT_SCOPE_KEY] = tenant
        connection: PacedConnection | None = scope.get(CONNECTION_SCOPE_KEY)
        if connection is None:  # not served by `guarded_protocol.py` (a test client)
            await self.app(scope, receive, send)
            return
        connection.request_started(tenant, bind=by_key)  # in progress until its response completes
        await self.app(scope, receive, send)


# a refusal at the door ran none of the contract's phases (`http/timing.py`): each says 0
_NO_PHASES = ", ".join(f"{phase};dur=0.000" for phase in ("parse", "tokenize", "queue", "forward", "post", "serialize"))


async def send_refusal(send: Send, refusal: DomainError, start: float) -> None:
    """The error answer to REFUSAL, with `WWW-Authenticate` on a 401 and Server-Timing."""
    status, body, table_headers = error_parts(refusal)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(name.encode(), value.encode()) for name, value in table_headers.items()]
    if isinstance(refusal, Unauthorized):
        challenge = 'Bearer realm="vllm-srun"'
        if refusal.message == "invalid API key":
            challenge += ', error="invalid_token"'
        headers.append((b"www-authenticate", challenge.encode()))
    total = (time.perf_counter() - start) * 1000
    headers.append((b"server-timing", f"{_NO_PHASES}, total;dur={total:.3f}".encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def tenant_of(scope: Mapping[str, Any]) -> str:
    """The tenant `AuthMiddleware` put in SCOPE (`default` where none is installed)."""
    tenant: str = scope.get(TENANT_SCOPE_KEY, DEFAULT_TENANT)
    return tenant
