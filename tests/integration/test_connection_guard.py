"""The connection guard on real loopback sockets (`adapters/http/guarded_protocol.py`): uvicorn
with the guarded httptools protocol and a small ASGI app, in a thread, with short limits.

Each test is one misbehaving client: a socket that never speaks, a head dribbled a byte at a
time, a head larger than the limit, a body shorter than its Content-Length, a client that never
reads its answer, one that half-closes after a full request, and sockets up to the cap (idle ones
give way; busy ones make the next connection get 503). Normal keep-alive traffic is untouched.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn

from tests.waiting import wait_until
from vllm_srun.adapters.cancellation import wait_disconnect
from vllm_srun.adapters.http.connection_guard import ConnectionGuard
from vllm_srun.adapters.http.guarded_protocol import uvicorn_config
from vllm_srun.adapters.http.listeners import bind_tcp
from vllm_srun.adapters.http.request_body import read_body
from vllm_srun.domain.errors import DomainError
from vllm_srun.domain.security.connections import ConnectionLimits, ConnectionPhase

LIMITS = ConnectionLimits(
    header_timeout_s=0.6, keep_alive_timeout_s=0.6, body_timeout_s=0.8, max_header_bytes=4096, max_connections=4
)
BIG = b"x" * (8 << 20)
WATCHED: list[str] = []  # what became of each /watch request: answered or disconnected


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    status, body = 200, b"{}"
    try:
        if scope["method"] == "POST":
            data = await read_body(scope, receive, 1 << 20)
            body = json.dumps({"bytes": len(data)}).encode()
        elif scope["path"] == "/slow":
            await asyncio.sleep(1.5)
        elif scope["path"] == "/watch":  # like a queued request: dropped when its client goes away
            gone = asyncio.ensure_future(wait_disconnect(receive))
            done, _ = await asyncio.wait({gone}, timeout=1.5)
            WATCHED.append("disconnected" if done else "answered")
            gone.cancel()
        elif scope["path"] == "/big":
            body = BIG
    except DomainError as exc:
        status, body = 499, exc.code.encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture()
def server() -> Iterator[tuple[int, ConnectionGuard]]:
    guard = ConnectionGuard(LIMITS)
    sock = bind_tcp("127.0.0.1", 0)
    port = sock.getsockname()[1]
    srv = uvicorn.Server(uvicorn_config(app, guard, lifespan="off", log_level="error", log_config=None))
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_until(lambda: srv.started, what="uvicorn started")
    yield port, guard
    srv.should_exit = True
    thread.join(10)


def in_phase(guard: ConnectionGuard, phase: ConnectionPhase) -> int:
    """Connections the guard holds in PHASE, read from the test's thread while the server's runs."""
    while True:
        try:
            return guard.table.count(phase)
        except RuntimeError:  # the table changed size under the count: count again
            pass


def connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(5)
    return s


def read_until_closed(s: socket.socket) -> bytes:
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    return out


def request(path: str = "/", body: bytes | None = None, extra: bytes = b"") -> bytes:
    if body is None:
        return b"GET " + path.encode() + b" HTTP/1.1\r\nhost: t\r\n" + extra + b"\r\n"
    return b"POST %s HTTP/1.1\r\nhost: t\r\ncontent-length: %d\r\n%s\r\n%s" % (path.encode(), len(body), extra, body)


def test_keep_alive_traffic_is_untouched(server: tuple[int, ConnectionGuard]) -> None:
    port, guard = server
    s = connect(port)
    for i in range(20):
        s.sendall(request("/", b'{"n": %d}' % i))
        head = s.recv(65536)
        assert head.startswith(b"HTTP/1.1 200") and b'{"bytes":' in head
    wait_until(lambda: in_phase(guard, ConnectionPhase.IDLE) == 1, what="the connection idle, kept alive")
    s.sendall(request("/"))  # still open within the keep-alive timeout
    assert s.recv(65536).startswith(b"HTTP/1.1 200")
    assert guard.closed == {}


def test_a_socket_that_never_speaks_is_closed_quietly(server: tuple[int, ConnectionGuard]) -> None:
    port, guard = server
    s = connect(port)
    start = time.monotonic()
    assert read_until_closed(s) == b""
    assert 0.5 < time.monotonic() - start < 2.5
    assert guard.closed == {"idle": 1}


def test_a_dribbled_head_gets_408(server: tuple[int, ConnectionGuard]) -> None:
    port, guard = server
    s = connect(port)
    start = time.monotonic()
    with pytest.raises(OSError):  # the server answered and closed while we were still dribbling
        for byte in b"GET / HTTP/1.1\r\nhost: t\r\nx-a: " + b"a" * 100:
            s.send(bytes([byte]))
            time.sleep(0.05)
    answer = read_until_closed(s)
    assert answer.startswith(b"HTTP/1.1 408") and b'"request_timeout"' in answer
    assert time.monotonic() - start < 3
    assert guard.closed == {"head_timeout": 1}


def test_an_oversized_head_gets_431_without_being_buffered(server: tuple[int, ConnectionGuard]) -> None:
    port, guard = server
    s = connect(port)
    try:
        s.sendall(b"GET / HTTP/1.1\r\nhost: t\r\nx-big: " + b"a" * 1_000_000 + b"\r\n\r\n")
    except OSError:
        pass  # closed under us once the head passed 4 KiB
    answer = read_until_closed(s)
    assert answer.startswith(b"HTTP/1.1 431") and b'"headers_too_large"' in answer
    assert guard.closed == {"headers_too_large": 1}


def test_a_body_shorter_than_its_length_gets_408(server: tuple[int, ConnectionGuard]) -> None:
    port, guard = server
    s = connect(port)
    s.sendall(b"POST / HTTP/1.1\r\nhost: t\r\ncontent-length: 100\r\n\r\n{")
    answer = read_until_closed(s)
    assert answer.startswith(b"HTTP/1.1 408") and b"body did not arrive" in answer
    assert guard.closed == {"body_timeout": 1}


def without_interim(answer: bytes) -> bytes:
    return answer.removeprefix(b"HTTP/1.1 100 Continue\r\n\r\n")


def test_a_half_closed_client_still_gets_its_answer(server: tuple[int, ConnectionGuard]) -> None:
    port, _ = server
    WATCHED.clear()
    s = connect(port)
    s.sendall(request("/watch"))
    s.shutdown(socket.SHUT_WR)
    answer = read_until_closed(s)  # an interim 100, then after 1.5 s the answer, then the server closes
    assert answer.startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
    assert without_interim(answer).startswith(b"HTTP/1.1 200") and b"connection: close" in answer
    assert WATCHED == ["answered"]


def test_a_client_that_closed_and_left_still_has_its_request_dropped(server: tuple[int, ConnectionGuard]) -> None:
    port, guard = server
    WATCHED.clear()
    s = connect(port)
    s.sendall(request("/watch"))
    wait_until(lambda: in_phase(guard, ConnectionPhase.BUSY) == 1, what="the /watch request in progress")
    s.close()  # FIN, like a half-close, but nobody reads: the interim 100 gets a reset
    wait_until(lambda: WATCHED, timeout=5, what="the /watch request ended")
    assert WATCHED == ["disconnected"]


def test_a_client_that_never_reads_is_dropped(server: tuple[int, ConnectionGuard]) -> None:
    port, guard = server
    s = connect(port)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.sendall(request("/big"))
    wait_until(lambda: guard.closed.get("send_timeout", 0) > 0, what=lambda: f"a send timeout (closed: {guard.closed})")


def test_idle_sockets_give_way_at_the_cap(server: tuple[int, ConnectionGuard]) -> None:
    port, guard = server
    idle = [connect(port) for _ in range(LIMITS.max_connections)]
    wait_until(
        lambda: in_phase(guard, ConnectionPhase.FRESH) == LIMITS.max_connections, what="every idle socket admitted"
    )
    s = connect(port)
    s.sendall(request("/", extra=b"connection: close\r\n"))
    assert read_until_closed(s).startswith(b"HTTP/1.1 200")
    assert guard.closed.get("evicted") == 1
    assert read_until_closed(idle[0]) == b""  # the longest-idle one went


def test_a_new_connection_gets_503_when_every_one_is_busy(server: tuple[int, ConnectionGuard]) -> None:
    port, guard = server
    busy = [connect(port) for _ in range(LIMITS.max_connections)]
    for s in busy:
        s.sendall(request("/slow"))
    wait_until(lambda: in_phase(guard, ConnectionPhase.BUSY) == LIMITS.max_connections, what="every connection busy")
    late = connect(port)
    late.sendall(request("/"))
    answer = read_until_closed(late)
    assert answer.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in answer and b"too_many_connections" in answer
    for s in busy:  # the requests in progress were not disturbed
        assert s.recv(65536).startswith(b"HTTP/1.1 200")
    assert guard.closed.get("refused") == 1


def test_malformed_http_gets_a_json_400(server: tuple[int, ConnectionGuard]) -> None:
    port, _ = server
    s = connect(port)
    s.sendall(b"NOT HTTP AT ALL\r\n\r\n")
    answer = read_until_closed(s)
    assert answer.startswith(b"HTTP/1.1 400") and b'"invalid_request"' in answer


def test_memory_is_released_once_a_crowd_of_connections_has_gone() -> None:
    quiet: list[int] = []

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        guard = ConnectionGuard(ConnectionLimits(max_connections=200), on_quiet=lambda: quiet.append(len(guard.table)))
        crowd: list[Any] = [object() for _ in range(100)]
        for conn in crowd:
            guard.admit(conn, loop)
        for conn in crowd[:74]:
            guard.forget(conn)
        assert quiet == []  # 26 of a peak of 100 left
        guard.forget(crowd[74])
        assert quiet == [25]  # a quarter: once
        for conn in crowd[75:]:
            guard.forget(conn)
        assert quiet == [25]  # the peak starts again from there

    asyncio.run(scenario())
