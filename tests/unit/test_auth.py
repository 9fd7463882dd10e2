"""The key check at the door (`adapters/http/auth.py`, R-AUTH-1..3): who a request is from its
head alone, refusals that never read the body, keys stripped from the scope, tenants only the
front may name; and the worker client's token and tenant header."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

import msgspec
import pytest

from vllm_srun.adapters.http.auth import TENANT_SCOPE_KEY, Authenticator, AuthMiddleware, tenant_of
from vllm_srun.adapters.workers.http_client import WorkerClient
from vllm_srun.domain.errors import InvalidRequest
from vllm_srun.domain.security.api_keys import KeyTable, Unauthorized, parse_key_file
from vllm_srun.domain.security.key_guessing import GuessLimits, TooManyWrongKeys

TOKEN = "internal-token-0123456789"


def table() -> KeyTable:
    lines = [f"{t} {hashlib.sha256(k.encode()).hexdigest()}" for t, k in (("acme", "key-a"), ("beta", "key-b"))]
    return parse_key_file("\n".join(lines))


def scope(path: str = "/v1/embeddings", key: str | None = None, tenant: str | None = None, **kw: Any) -> dict[str, Any]:
    headers = [(b"content-type", b"application/json")]
    if key is not None:
        headers.append((b"authorization", key.encode()))
    if tenant is not None:
        headers.append((b"x-vllm-srun-tenant", tenant.encode()))
    return {
        "type": "http",
        "method": "POST",
        "path": path,
        "headers": headers,
        "client": kw.get("client", ("10.0.0.1", 5000)),
    }


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_keys_name_their_tenants_and_the_key_leaves_the_scope() -> None:
    auth = Authenticator(table)
    s = scope(key="Bearer key-a")
    assert auth.tenant(s) == "acme"
    assert all(name != b"authorization" for name, _ in s["headers"])
    assert auth.tenant(scope(key="bearer   key-b ")) == "beta"  # the scheme in any case, spaces around


@pytest.mark.parametrize("path", ["/health", "/health/live", "/metrics"])
def test_health_and_metrics_are_open(path: str) -> None:
    assert Authenticator(table).tenant(scope(path)) == "default"


def test_metrics_can_need_a_key() -> None:
    auth = Authenticator(table, metrics_open=False)
    with pytest.raises(Unauthorized):
        auth.tenant(scope("/metrics"))
    assert auth.tenant(scope("/metrics", key="Bearer key-a")) == "acme"


@pytest.mark.parametrize(
    ("key", "message"),
    [
        (None, "this server needs an API key: send 'Authorization: Bearer KEY'"),
        ("key-a", "the Authorization header must be 'Bearer KEY'"),
        ("Basic a2V5LWE=", "the Authorization header must be 'Bearer KEY'"),
        ("Bearer ", "the Authorization header must be 'Bearer KEY'"),
        ("Bearer key-c", "invalid API key"),
        ("Bearer " + hashlib.sha256(b"key-a").hexdigest(), "invalid API key"),  # the digest is no key
    ],
)
def test_missing_malformed_and_wrong_keys_are_refused(key: str | None, message: str) -> None:
    with pytest.raises(Unauthorized) as refused:
        Authenticator(table).tenant(scope(key=key))
    assert refused.value.message == message


def test_two_authorization_headers_are_refused() -> None:
    s = scope(key="Bearer key-a")
    s["headers"].append((b"authorization", b"Bearer key-b"))
    with pytest.raises(Unauthorized):
        Authenticator(table).tenant(s)


def test_a_client_cannot_name_its_tenant() -> None:
    auth = Authenticator(table, TOKEN)
    with pytest.raises(InvalidRequest, match="only the front names a tenant"):
        auth.tenant(scope(key="Bearer key-a", tenant="beta"))
    with pytest.raises(InvalidRequest):  # nor on a server without keys
        Authenticator().tenant(scope(tenant="beta"))
    with pytest.raises(Unauthorized):  # nor without a key
        auth.tenant(scope(tenant="beta"))


def test_the_front_names_tenants_with_the_token_or_over_its_unix_socket() -> None:
    auth = Authenticator(table, TOKEN)
    assert auth.tenant(scope(key=f"Bearer {TOKEN}", tenant="beta")) == "beta"
    assert auth.tenant(scope(key=f"Bearer {TOKEN}")) == "default"
    with pytest.raises(InvalidRequest, match="not a tenant name"):
        auth.tenant(scope(key=f"Bearer {TOKEN}", tenant="a b"))
    assert Authenticator().tenant(scope(tenant="beta", client=None)) == "beta"  # a managed worker
    assert Authenticator().tenant(scope()) == "default"


def test_a_token_alone_lets_only_the_front_in() -> None:
    auth = Authenticator(None, TOKEN)
    assert auth.required
    with pytest.raises(Unauthorized):
        auth.tenant(scope(key="Bearer key-a"))
    assert auth.tenant(scope(key=f"Bearer {TOKEN}")) == "default"


def test_guessers_are_slowed_before_their_key_is_looked_at() -> None:
    clock = Clock()
    auth = Authenticator(table, limits=GuessLimits(per_connection=3, per_address=10, window_s=30), clock=clock)
    for _ in range(3):
        with pytest.raises(Unauthorized):
            auth.tenant(scope(key="Bearer guess"))
    with pytest.raises(TooManyWrongKeys) as slowed:
        auth.tenant(scope(key="Bearer key-a"))  # even the right key: a right guess looks like a wrong one
    assert slowed.value.retry_after_s == 30
    assert auth.tenant(scope(key="Bearer key-a", client=("10.0.0.1", 5001))) == "acme"  # its other connection
    assert auth.tenant(scope(key="Bearer key-b", client=("10.0.0.2", 5000))) == "beta"  # another client
    for _ in range(5):  # missing keys are no guesses
        with pytest.raises(Unauthorized):
            auth.tenant(scope(client=("10.0.0.3", 1)))
    assert auth.tenant(scope(key="Bearer key-a", client=("10.0.0.3", 1))) == "acme"
    clock.now += 30
    assert auth.tenant(scope(key="Bearer key-a")) == "acme"


def run_middleware(auth: Authenticator, s: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the scopes the app saw, the messages sent); a refusal must not have read the body."""
    seen: list[dict[str, Any]] = []
    sent: list[dict[str, Any]] = []
    reads: list[bool] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append(scope)
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def receive() -> dict[str, Any]:
        reads.append(True)
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(AuthMiddleware(app, auth)(s, receive, send))
    assert bool(reads) == bool(seen)  # the body is read only by an app that let the request in
    return seen, sent


def test_a_refusal_reads_no_body_and_says_bearer() -> None:
    seen, sent = run_middleware(Authenticator(table), scope(key="Bearer nope"))
    assert seen == []
    start = sent[0]
    headers = dict(start["headers"])
    assert start["status"] == 401
    assert headers[b"www-authenticate"] == b'Bearer realm="vllm-srun", error="invalid_token"'
    assert b"server-timing" in headers
    body = msgspec.json.decode(sent[1]["body"])
    assert body == {"error": {"code": "unauthorized", "message": "invalid API key"}}
    assert b"nope" not in sent[1]["body"]


def test_a_slowed_client_gets_429_with_retry_after() -> None:
    auth = Authenticator(table, limits=GuessLimits(per_connection=1, per_address=5, window_s=7))
    run_middleware(auth, scope(key="Bearer nope"))
    _, sent = run_middleware(auth, scope(key="Bearer nope"))
    assert sent[0]["status"] == 429
    assert dict(sent[0]["headers"])[b"retry-after"] == b"7"
    assert msgspec.json.decode(sent[1]["body"])["error"]["code"] == "too_many_wrong_keys"


def test_a_good_key_reaches_the_app_with_its_tenant() -> None:
    seen, sent = run_middleware(Authenticator(table), scope(key="Bearer key-b"))
    assert sent[0]["status"] == 200
    assert seen[0][TENANT_SCOPE_KEY] == "beta" and tenant_of(seen[0]) == "beta"
    assert tenant_of({}) == "default"


def test_the_worker_client_sends_its_token_and_the_tenant(tmp_path: Path) -> None:
    heads: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heads.append(await reader.readuntil(b"\r\n\r\n"))
        await reader.readexactly(2)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
        await writer.drain()
        writer.close()

    async def go() -> None:
        server = await asyncio.start_server(handler, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        with_token = WorkerClient(host="127.0.0.1", port=port, token=TOKEN)
        without = WorkerClient(host="127.0.0.1", port=port)
        unix = WorkerClient(uds=str(tmp_path / "w.sock"))
        assert with_token.names_tenants and unix.names_tenants and not without.names_tenants
        assert TOKEN not in repr(with_token)
        await with_token.request("POST", "/v1/x", b"{}", headers=((b"x-vllm-srun-tenant", b"acme"),))
        await without.request("POST", "/v1/x", b"{}", headers=((b"x-bad", b"a\r\nevil: 1"),))
        server.close()

    asyncio.run(go())
    assert f"authorization: Bearer {TOKEN}\r\n".encode() in heads[0]
    assert b"x-vllm-srun-tenant: acme\r\n" in heads[0]
    assert b"authorization" not in heads[1] and b"evil" not in heads[1]
    with pytest.raises(ValueError):
        WorkerClient(host="h", port=1, token="has space")
