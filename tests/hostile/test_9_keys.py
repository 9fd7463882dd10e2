"""Hostile clients against API keys (R-AUTH-1..3), on a real worker and a real front that ask for
keys: a missing key is refused from the request head alone (a 50 MB body announced and never
sent still gets its 401 at once); many wrong keys from one connection or one address are slowed
(429 + Retry-After, even for a right key then) while clients elsewhere keep their latency and no
forward is spent on any of it; a client cannot choose its tenant by header nor guess the internal
token; no key or digest shows in logs, errors, `/metrics` or the cards."""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.hostile.clients import LIMITS, Server, read_until_closed, start
from tests.prometheus_text import metric

PER_CONNECTION, PER_ADDRESS, WINDOW_S = 5, 20, 60  # domain/security/key_guessing.GuessLimits' defaults
TOKEN = "hostile-internal-token-0123456789abcdef"


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@pytest.fixture(scope="module")
def secrets_(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, str]]:
    folder = tmp_path_factory.mktemp("hostile-keys")
    keys = {"acme": "srk-acme-" + "a" * 40, "beta": "srk-beta-" + "b" * 40}
    (folder / "keys").write_text("".join(f"{t} {digest(k)}\n" for t, k in keys.items()))
    (folder / "token").write_text(TOKEN + "\n")
    return folder / "keys", folder / "token", keys


@pytest.fixture(scope="module")
def keyed_worker(encoder_fixture, secrets_: tuple[Path, Path, dict[str, str]]) -> Iterator[Server]:  # type: ignore[no-untyped-def]
    key_file, token_file, _ = secrets_
    argv = [
        "vllm_srun.app.cli",
        "serve",
        str(encoder_fixture("embed")),
        "--log-level",
        "info",
        *LIMITS,
        "--result-cache-entries",
        "0",
    ]
    with start([*argv, "--api-key-file", str(key_file), "--internal-token-file", str(token_file)]) as server:
        server.extra.update(kind="worker", model="tiny-embed")
        yield server


@pytest.fixture(scope="module")
def keyed_front(
    encoder_fixture, secrets_: tuple[Path, Path, dict[str, str]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:  # type: ignore[no-untyped-def]
    config = Path(tmp_path_factory.mktemp("hostile-keyed-front")) / "config.yaml"
    embed = {"artifact": str(encoder_fixture("embed")), "replicas": [{"device": "cpu"}], "result_cache_entries": 0}
    config.write_text(json.dumps({"global": {"model_catalog": {"deployments": {"embed": embed}}}}))
    argv = ["vllm_srun.app.front_cli", "serve", "--config", str(config), "--log-level", "info", *LIMITS]
    with start([*argv, "--api-key-file", str(secrets_[0])]) as server:  # /health: 200 once the worker is ready
        server.extra.update(kind="front", model="embed")
        yield server


@pytest.fixture(params=["worker", "front"])
def keyed(request: pytest.FixtureRequest) -> Server:
    return request.getfixturevalue(f"keyed_{request.param}")  # type: ignore[no-any-return]


def client_from(address: str, **kw: object) -> httpx.Client:
    """A keep-alive client whose connections come from ADDRESS (any of 127.0.0.0/8 on Linux)."""
    return httpx.Client(transport=httpx.HTTPTransport(local_address=address), timeout=30, **kw)  # type: ignore[arg-type]


def embed(client: httpx.Client, server: Server, key: str | None, **headers: str) -> httpx.Response:
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    body = {"model": server.extra["model"], "input": ["hello"]}
    return client.post(server.base + "/v1/embeddings", json=body, headers=headers)


def forwards(server: Server) -> float:
    if server.extra["kind"] != "worker":
        return 0.0
    return metric(httpx.get(server.base + "/metrics").text, "vllm_srun_forwards_total") or 0.0


def test_a_missing_key_is_refused_from_the_head_alone(keyed: Server) -> None:
    s = socket.create_connection((keyed.host, keyed.port), source_address=("127.0.0.21", 0))
    s.settimeout(5)
    started = time.monotonic()
    s.sendall(
        b"POST /v1/embeddings HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 50000000\r\n\r\n"
    )  # the body never comes
    head = s.recv(65536)
    assert time.monotonic() - started < 2
    assert head.startswith(b"HTTP/1.1 401 ")
    assert b'www-authenticate: Bearer realm="vllm-srun"' in head
    assert b'"code":"unauthorized"' in head or b'"code":"unauthorized"' in read_until_closed(s, 1)
    s.close()
    with client_from("127.0.0.21") as client:
        for path in (
            "/v1/models",
            "/openapi.json",
            "/api/v1/inventory" if keyed.extra["kind"] == "front" else "/v1/models",
        ):
            answer = client.get(keyed.base + path)
            assert answer.status_code == 401 and answer.json()["error"]["code"] == "unauthorized", path
        for path in ("/health", "/health/live", "/metrics"):
            assert client.get(keyed.base + path).status_code == 200, path


def test_key_guessing_is_slowed_and_nobody_else_is(keyed: Server, secrets_: tuple[Path, Path, dict[str, str]]) -> None:
    good = secrets_[2]["acme"]
    before = forwards(keyed)
    # one connection: PER_CONNECTION wrong keys, then even the right key waits
    with client_from("127.0.0.31") as one:
        for n in range(PER_CONNECTION):
            assert embed(one, keyed, f"srk-guess-{n}").status_code == 401
        slowed = embed(one, keyed, good)
        assert slowed.status_code == 429 and slowed.json()["error"]["code"] == "too_many_wrong_keys"
        assert 1 <= int(slowed.headers["retry-after"]) <= WINDOW_S
    with client_from("127.0.0.31") as other_connection:  # the address has guessed 5 of its 20
        assert embed(other_connection, keyed, good).status_code == 200
    # one address, a fresh connection per guess, while a client elsewhere keeps working
    latencies: list[float] = []
    stop = threading.Event()

    def bystander() -> None:
        with client_from("127.0.0.33") as c:
            while not stop.is_set():
                began = time.perf_counter()
                assert embed(c, keyed, secrets_[2]["beta"]).status_code == 200
                latencies.append(time.perf_counter() - began)

    thread = threading.Thread(target=bystander, daemon=True)
    thread.start()
    try:
        statuses = []
        for n in range(PER_ADDRESS + 10):
            with client_from("127.0.0.32") as fresh:
                statuses.append(embed(fresh, keyed, f"srk-guess-{n}").status_code)
        with client_from("127.0.0.32") as fresh:
            right = embed(fresh, keyed, good)
    finally:
        stop.set()
        thread.join(30)
    assert statuses[:PER_ADDRESS] == [401] * PER_ADDRESS
    assert statuses[PER_ADDRESS:] == [429] * 10
    assert right.status_code == 429  # a right guess looks like a wrong one while it waits
    assert latencies and max(latencies) < 2.0
    if keyed.extra["kind"] == "worker":  # the bystander's and the other connection's requests only
        assert 1 <= forwards(keyed) - before <= len(latencies) + 1


def test_a_client_cannot_choose_its_tenant(keyed: Server, secrets_: tuple[Path, Path, dict[str, str]]) -> None:
    with client_from("127.0.0.41") as client:
        forged = embed(client, keyed, secrets_[2]["acme"], **{"x-vllm-srun-tenant": "beta"})
        assert forged.status_code == 400
        assert forged.json()["error"] == {
            "code": "invalid_request",
            "message": "x-vllm-srun-tenant: only the front names a tenant; a client's tenant is its key's",
        }
        unkeyed = embed(client, keyed, None, **{"x-vllm-srun-tenant": "beta"})
        assert unkeyed.status_code == 401
        guessed = embed(client, keyed, TOKEN[:-1] + "X", **{"x-vllm-srun-tenant": "beta"})
        assert guessed.status_code == 401  # a wrong token is a wrong key
        assert embed(client, keyed, secrets_[2]["acme"]).status_code == 200


def test_no_key_or_digest_shows_anywhere(keyed: Server, secrets_: tuple[Path, Path, dict[str, str]]) -> None:
    keys = secrets_[2]
    with client_from("127.0.0.51") as client:
        seen = [
            client.get(keyed.base + "/metrics").text,
            client.get(keyed.base + "/v1/models", headers={"authorization": f"Bearer {keys['acme']}"}).text,
            embed(client, keyed, keys["acme"] + "x").text,
            embed(client, keyed, keys["acme"], **{"x-vllm-srun-tenant": "beta"}).text,
            keyed.log(),
        ]
    text = "\n".join(seen)
    assert '"object":"list"' in seen[1] or '"data"' in seen[1]
    for secret in (*keys.values(), *map(digest, keys.values()), TOKEN, digest(TOKEN)):
        assert secret not in text
        assert secret[:16] not in text
