"""Paced reads on real loopback sockets (R-FAIR-5, `adapters/http/read_pacing.py`): uvicorn with
the guarded protocol, the key check of `http/auth.py` (tenants A and B) and a small app whose
`/block` requests stay in progress until the test lets them go.

The floor is 2 here: while A holds 2 or more requests, more than its share, and B is active, A's
next requests wait unread until A's own requests finish — then they are read and answered; B's
are read at once. A tenant alone is never held. A held request whose client half-closes after
sending it is read (with its end) in turn and answered; one held past the keep-alive timeout is not closed as idle.
"""

from __future__ import annotations

import asyncio
import hashlib
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn

from tests.waiting import wait_until
from vllm_srun.adapters.http.auth import TENANT_SCOPE_KEY, Authenticator, AuthMiddleware
from vllm_srun.adapters.http.connection_guard import ConnectionGuard
from vllm_srun.adapters.http.guarded_protocol import uvicorn_config
from vllm_srun.adapters.http.listeners import bind_tcp
from vllm_srun.adapters.http.read_pacing import PacedReads
from vllm_srun.domain.security.api_keys import parse_key_file
from vllm_srun.domain.security.connections import ConnectionLimits

KEYS = {"A": "srk-pace-a-" + "a" * 32, "B": "srk-pace-b-" + "b" * 32}
TABLE = parse_key_file("".join(f"{t} {hashlib.sha256(k.encode()).hexdigest()}\n" for t, k in KEYS.items()))


class App:
    def __init__(self) -> None:
        self.started: list[str] = []  # tenant and path of each request, in the order the app saw them
        self.release = threading.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        self.started.append(f"{scope[TENANT_SCOPE_KEY]}{scope['path']}")
        if scope["path"] == "/block":
            await asyncio.to_thread(self.release.wait)
        headers = [(b"content-type", b"application/json"), (b"content-length", b"2")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"{}"})


FLOOR = 2
KEEP_ALIVE_S = 1.0


@pytest.fixture()
def server() -> Iterator[tuple[int, PacedReads, App]]:
    reads = PacedReads(floor=FLOOR)
    guard = ConnectionGuard(ConnectionLimits(keep_alive_timeout_s=KEEP_ALIVE_S), reads=reads)
    app = App()
    wrapped = AuthMiddleware(app, Authenticator(lambda: TABLE))
    sock = bind_tcp("127.0.0.1", 0)
    srv = uvicorn.Server(uvicorn_config(wrapped, guard, lifespan="off", log_level="error", log_config=None))
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_until(lambda: srv.started, what="uvicorn started")
    yield sock.getsockname()[1], reads, app
    app.release.set()
    srv.should_exit = True
    thread.join(10)


def connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(10)
    return s


def send(s: socket.socket, tenant: str, path: str) -> None:
    s.sendall(f"GET {path} HTTP/1.1\r\nhost: t\r\nauthorization: Bearer {KEYS[tenant]}\r\n\r\n".encode())


def answer(s: socket.socket) -> bytes:
    out = b""
    while not out.endswith(b"{}"):
        chunk = s.recv(65536)
        assert chunk, out
        out += chunk
    return out


def ask(s: socket.socket, tenant: str, path: str = "/quick") -> bytes:
    send(s, tenant, path)
    return answer(s)


def bound(port: int, tenant: str, count: int) -> list[socket.socket]:
    """COUNT connections whose first request bound them to TENANT."""
    socks = [connect(port) for _ in range(count)]
    for s in socks:
        assert ask(s, tenant).startswith(b"HTTP/1.1 200")
    return socks


def silent(s: socket.socket, seconds: float) -> bool:
    """Nothing arrives on S for SECONDS (its request waits unread)."""
    s.settimeout(seconds)
    try:
        s.recv(1, socket.MSG_PEEK)
    except TimeoutError:
        return True
    finally:
        s.settimeout(10)
    return False


def test_a_flooding_tenants_next_requests_wait_until_its_own_finish_and_are_answered(
    server: tuple[int, PacedReads, App],
) -> None:
    port, reads, app = server
    a = bound(port, "A", 2 + 4)
    b = bound(port, "B", 1)
    send(b[0], "B", "/block")  # B stays active
    for s in a[:FLOOR]:
        send(s, "A", "/block")
    wait_until(
        lambda: app.started.count("A/block") == FLOOR and "B/block" in app.started,
        what="the blocked requests in progress",
    )
    for s in a[FLOOR:]:
        send(s, "A", "/quick")
    wait_until(lambda: reads.waiting("A") == 4, what="A's next requests held")
    assert silent(a[FLOOR], KEEP_ALIVE_S + 0.3)  # past the keep-alive timeout: held, not closed as idle
    assert ask(connect(port), "B").startswith(b"HTTP/1.1 200")  # B within its share: read at once
    assert app.started.count("A/quick") == len(a)  # the binding requests only
    app.release.set()  # A's requests finish: its held ones are read, in turn, and answered
    for s in [*a, b[0]]:
        assert answer(s).startswith(b"HTTP/1.1 200")
    assert reads.held == 4 and reads.waiting("A") == 0
    assert app.started.count("A/quick") == len(a) + 4
    wait_until(lambda: reads.pacing.in_progress("A") == 0, what="nothing counted in progress once answered")


def test_a_tenant_alone_is_never_held(server: tuple[int, PacedReads, App]) -> None:
    port, reads, app = server
    a = bound(port, "A", 6)
    for s in a[:3]:
        send(s, "A", "/block")
    wait_until(lambda: app.started.count("A/block") == 3, what="the blocked requests in progress")
    for s in a[3:]:
        assert ask(s, "A").startswith(b"HTTP/1.1 200")
    assert reads.held == 0
    app.release.set()
    for s in a[:3]:
        assert answer(s).startswith(b"HTTP/1.1 200")


def test_a_held_request_whose_client_half_closes_is_answered(server: tuple[int, PacedReads, App]) -> None:
    port, reads, app = server
    a = bound(port, "A", 3)
    b = bound(port, "B", 1)
    send(b[0], "B", "/block")
    for s in a[:2]:
        send(s, "A", "/block")
    wait_until(
        lambda: app.started.count("A/block") == 2 and "B/block" in app.started, what="the blocked requests in progress"
    )
    send(a[2], "A", "/quick")
    wait_until(lambda: reads.waiting("A") == 1, what="the request held")
    a[2].shutdown(socket.SHUT_WR)  # unread, like its request, until A's requests finish
    assert silent(a[2], 0.3)
    app.release.set()
    assert b"HTTP/1.1 200" in answer(a[2])  # after the interim 100 Continue of a half-closed request
    assert reads.held == 1
