"""The front's worker client: keep-alive reuse, a pooled connection the worker closed, chunked
bodies, broken connections and cancellation (adapters/workers/http_client.py)."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from vllm_srun.adapters.workers import http_client
from vllm_srun.adapters.workers.http_client import WorkerClient, WorkerUnavailable, WorkerUnreachable

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        (int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")), 0
    )
    return await reader.readexactly(length)


def serve(tmp_path: Path, handler: Handler, test: Callable[[WorkerClient], Awaitable[None]]) -> None:
    async def go() -> None:
        path = str(tmp_path / "w.sock")
        server = await asyncio.start_unix_server(handler, path)
        client = WorkerClient(uds=path)
        try:
            await asyncio.wait_for(test(client), 10)
        finally:
            client.close_idle()
            server.close()

    asyncio.run(go())


def test_keep_alive_reuses_one_connection(tmp_path: Path) -> None:
    connections = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        try:
            while True:
                body = await read_request(reader)
                writer.write(
                    OK
                    if body != b"chunked"
                    else b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
                )
        except asyncio.IncompleteReadError:
            writer.close()

    async def test(client: WorkerClient) -> None:
        for _ in range(3):
            response = await client.request("POST", "/v1/embeddings", b"{}")
            assert (response.status, response.body) == (200, b"{}")
        assert (await client.request("POST", "/x", b"chunked")).body == b"abcde"
        assert len(connections) == 1

    serve(tmp_path, handler, test)


def test_a_pooled_connection_the_worker_closed_is_replaced(tmp_path: Path) -> None:
    seen = []
    hung_up = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        seen.append(1)
        writer.write(OK)
        await writer.drain()
        writer.close()  # no keep-alive header: the client pooled it, the worker hangs up
        await writer.wait_closed()
        hung_up.set()

    async def test(client: WorkerClient) -> None:
        assert (await client.request("GET", "/health")).status == 200
        await asyncio.wait_for(hung_up.wait(), 5)
        assert (await client.request("GET", "/health")).status == 200
        assert len(seen) == 2

    serve(tmp_path, handler, test)


def test_a_connection_broken_mid_response_is_worker_unavailable(tmp_path: Path) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b'HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{"partial')
        await writer.drain()
        writer.close()

    async def test(client: WorkerClient) -> None:
        with pytest.raises(WorkerUnavailable, match="mid-response"):
            await client.request("POST", "/v1/embeddings", b"{}")

    serve(tmp_path, handler, test)


def test_a_cancelled_request_closes_its_connection(tmp_path: Path) -> None:
    async def go() -> None:
        hung_up = asyncio.Event()

        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_request(reader)
            await reader.read(1)  # b"" once the client closes
            hung_up.set()

        path = str(tmp_path / "w.sock")
        server = await asyncio.start_unix_server(handler, path)
        client = WorkerClient(uds=path)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(client.request("POST", "/v1/embeddings", b"{}"), 0.1)
        await asyncio.wait_for(hung_up.wait(), 5)
        server.close()

    asyncio.run(go())


def test_no_worker_is_worker_unreachable(tmp_path: Path) -> None:
    async def go() -> None:
        with pytest.raises(WorkerUnreachable, match="cannot connect"):  # a WorkerUnavailable: never sent
            await WorkerClient(uds=str(tmp_path / "missing.sock")).request("GET", "/health")
        with socket.socket() as spare:  # a TCP port nobody listens on: refused
            spare.bind(("127.0.0.1", 0))
            port = spare.getsockname()[1]
        with pytest.raises(WorkerUnreachable, match="cannot connect"):
            await WorkerClient(host="127.0.0.1", port=port).request("GET", "/health")

    asyncio.run(go())


def test_a_handshake_that_never_completes_is_unreachable_within_the_connect_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def black_hole(*args: object, **kwargs: object) -> None:
        await asyncio.sleep(3600)  # SYNs into a host that went away

    monkeypatch.setattr(http_client, "CONNECT_TIMEOUT_S", 0.05)
    monkeypatch.setattr(http_client.asyncio, "open_connection", black_hole)

    async def go() -> None:
        started = time.monotonic()
        with pytest.raises(WorkerUnreachable, match=r"no answer within 0\.05 s"):
            await WorkerClient(host="10.231.0.2", port=8100).request("GET", "/health")
        assert time.monotonic() - started < 1.0

    asyncio.run(go())


def test_an_ipv6_endpoint_is_named_in_brackets_in_the_host_header(monkeypatch: pytest.MonkeyPatch) -> None:
    heads: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heads.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(OK)
        await writer.drain()
        writer.close()

    async def go() -> None:
        server = await asyncio.start_server(handler, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        connect = asyncio.open_connection
        # every endpoint's connection reaches this server, which reads the Host header it was sent
        monkeypatch.setattr(
            http_client.asyncio, "open_connection", lambda _h, _p, **kw: connect("127.0.0.1", port, **kw)
        )
        try:
            for host in ("fd00::2", "worker-0.workers"):
                assert (await WorkerClient(host=host, port=8100).request("GET", "/health")).status == 200
        finally:
            server.close()

    asyncio.run(go())
    sent = [line for head in heads for line in head.split(b"\r\n") if line.startswith(b"host: ")]
    assert sent == [b"host: [fd00::2]:8100", b"host: worker-0.workers:8100"]
