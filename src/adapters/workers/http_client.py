"""A small keep-alive HTTP/1.1 client for talking to workers, over a Unix socket or TCP.

Why not httpx: against one worker over a Unix socket, `httpx.AsyncClient` alone took more than
the millisecond the front may add to a request, and this client less (the figures:
docs/performance.md). This client
writes one request and reads one response with two stream calls (`readuntil` for the head,
`readexactly` for the body); `bench/front_overhead.py` measures the front end to end.

Semantics the front relies on:
- A request that is cancelled (deadline, client gone) closes its connection, so the worker
  sees the disconnect and drops the request's queued rows.
- A worker that dies mid-request surfaces at once as `WorkerUnavailable` (the kernel resets
  the socket); nothing waits for a timeout.
- An idle pooled connection the worker already closed is detected, or, when the close races
  the write, the request is retried once on a fresh connection (nothing was read, so the
  worker never saw it).
- A connection that cannot be opened (refused, no route to the host, or no answer within
  `CONNECT_TIMEOUT_S`, or a TLS handshake that fails) is `WorkerUnreachable`: the request was
  never sent, so the front may offer it to another replica.
- An attached replica may need the deployment's internal token (R-AUTH-3): it goes on every
  request as `Authorization: Bearer`; over https the replica's certificate is verified against
  the system's CAs or the deployment's CA file (`tls_context`).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from dataclasses import dataclass

IDLE_TIMEOUT_S = 15.0  # below uvicorn's 30 s keep-alive, so the worker never closes first
CONNECT_TIMEOUT_S = 1.0  # a handshake the kernel completes: longer means the host is gone or its SYNs are lost
MAX_IDLE = 64
HEAD_LIMIT = 64 * 1024


class WorkerUnavailable(ConnectionError):
    """The worker could not be reached, or the connection broke before a full response."""


class WorkerUnreachable(WorkerUnavailable):
    """No connection could be opened: the request was not sent."""


@dataclass(slots=True)
class WorkerResponse:
    status: int
    headers: dict[bytes, bytes]  # lower-case names
    body: bytes


class _Connection:
    __slots__ = ("idle_since", "reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.idle_since = 0.0

    def usable(self, now: float) -> bool:
        return not self.writer.is_closing() and not self.reader.at_eof() and now - self.idle_since < IDLE_TIMEOUT_S

    def close(self) -> None:
        self.writer.close()


def tls_context(ca_file: str | None = None) -> ssl.SSLContext:
    """A client TLS context that verifies the server's certificate and name: against CA_FILE
    when given (a private CA), else the system's CAs. ValueError (one line) on a bad CA file."""
    try:
        return ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__
        raise ValueError(f"CA file {ca_file}: {reason}") from None


class WorkerClient:
    """Requests to one worker (`uds` path, or `host`+`port` with an optional base path; TLS is
    `True` for the system's CAs or a context from `tls_context`; TOKEN goes on every request)."""

    def __init__(
        self,
        *,
        uds: str | None = None,
        host: str | None = None,
        port: int | None = None,
        base_path: str = "",
        host_header: str = "worker",
        tls: bool | ssl.SSLContext = False,
        token: str | None = None,
    ) -> None:
        if (uds is None) == (host is None):
            raise ValueError("give either uds or host and port")
        self.uds, self.host, self.port = uds, host, port
        self.tls = tls if isinstance(tls, ssl.SSLContext) else (tls_context() if tls else None)
        self.base_path = base_path.rstrip("/")
        named = f"[{host}]" if host and ":" in host else host  # an IPv6 address in brackets
        self._host_header = (host_header if uds else f"{named}:{port}").encode()
        if token is not None and not _header_safe(token.encode()):
            raise ValueError("the internal token must be printable, without spaces")
        self._auth = b"" if token is None else b"authorization: Bearer " + token.encode() + b"\r\n"
        self._idle: list[_Connection] = []

    @property
    def names_tenants(self) -> bool:
        """Whether the worker takes the tenant this client names: over its private Unix socket,
        or with the internal token (R-AUTH-3)."""
        return self.uds is not None or bool(self._auth)

    def __repr__(self) -> str:  # never the token
        return f"WorkerClient({self.uds or f'{self.host}:{self.port}'})"

    async def _connect(self) -> _Connection:
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                if self.uds is not None:
                    reader, writer = await asyncio.open_unix_connection(self.uds, limit=HEAD_LIMIT)
                else:
                    reader, writer = await asyncio.open_connection(self.host, self.port, limit=HEAD_LIMIT, ssl=self.tls)
                    sock = writer.get_extra_info("socket")
                    if sock is not None:
                        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except TimeoutError:
            raise WorkerUnreachable(f"cannot connect to {self!r}: no answer within {CONNECT_TIMEOUT_S:g} s") from None
        except ssl.SSLError as exc:  # e.g. a certificate the CA did not sign, or for another name
            raise WorkerUnreachable(f"cannot connect to {self!r}: TLS: {exc.reason or exc}") from None
        except OSError as exc:
            raise WorkerUnreachable(f"cannot connect to {self!r}: {exc.strerror or exc}") from None
        return _Connection(reader, writer)

    def _take_idle(self) -> _Connection | None:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if conn.usable(now):
                return conn
            conn.close()
        return None

    def close_idle(self) -> None:
        """Drop every pooled connection (the worker restarted, or the front is stopping)."""
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    async def request(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        content_type: bytes = b"application/json",
        headers: tuple[tuple[bytes, bytes], ...] = (),
    ) -> WorkerResponse:
        """One request; HEADERS (names and values without CR, LF or leading space, e.g. the
        front's tenant header) go beside the client's own."""
        extra = b"".join(name + b": " + value + b"\r\n" for name, value in headers if _header_safe(name + value))
        head = (
            f"{method} {self.base_path}{path} HTTP/1.1\r\n".encode()
            + b"host: "
            + self._host_header
            + b"\r\n"
            + self._auth
            + extra
            + b"content-type: "
            + content_type
            + b"\r\ncontent-length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
        )
        conn = self._take_idle()
        reused = conn is not None
        if conn is None:
            conn = await self._connect()
        try:
            try:
                return await self._exchange(conn, head + body)
            except _ClosedBeforeResponse:
                if not reused:
                    raise
                conn.close()  # the worker closed an idle connection as we wrote: retry once
                try:
                    conn = await self._connect()
                except WorkerUnreachable as exc:
                    # the worker may have taken the request before it went away (killed mid-forward):
                    # a failure of this replica, never re-sent elsewhere (a request that crashes
                    # workers must not take down the next replica too)
                    raise WorkerUnavailable(f"{self!r} went away with the request: {exc}") from None
                return await self._exchange(conn, head + body)
        except _ClosedBeforeResponse as exc:
            raise WorkerUnavailable(f"{self!r} closed the connection: {exc}") from None
        except BaseException:
            conn.close()  # cancelled or broken mid-response: never reuse it
            raise

    async def _exchange(self, conn: _Connection, data: bytes) -> WorkerResponse:
        conn.writer.write(data)
        try:
            raw = await conn.reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            conn.close()
            if exc.partial:
                raise WorkerUnavailable(f"{self!r} closed the connection mid-response") from None
            raise _ClosedBeforeResponse("no response") from None
        except (ConnectionError, OSError) as exc:
            conn.close()
            raise _ClosedBeforeResponse(str(exc)) from None
        except asyncio.LimitOverrunError:
            conn.close()
            raise WorkerUnavailable(f"{self!r} sent a response head over {HEAD_LIMIT} bytes") from None
        status, headers = _parse_head(raw)
        try:
            if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
                body = await _read_chunked(conn.reader)
            elif b"content-length" in headers:
                body = await conn.reader.readexactly(int(headers[b"content-length"]))
            else:
                body = await conn.reader.read()
                headers[b"connection"] = b"close"
        except (asyncio.IncompleteReadError, ConnectionError, OSError, ValueError):
            conn.close()
            raise WorkerUnavailable(f"{self!r} closed the connection mid-response") from None
        if headers.get(b"connection", b"").lower() == b"close":
            conn.close()
        else:
            conn.idle_since = time.monotonic()
            if len(self._idle) < MAX_IDLE:
                self._idle.append(conn)
            else:
                conn.close()
        return WorkerResponse(status, headers, body)


def _header_safe(text: bytes) -> bool:
    return bool(text) and all(32 < byte < 127 for byte in text)


class _ClosedBeforeResponse(Exception):
    """EOF or reset before any byte of a response: the worker did not take the request."""


def _parse_head(raw: bytes) -> tuple[int, dict[bytes, bytes]]:
    lines = raw[:-4].split(b"\r\n")
    try:
        status = int(lines[0].split(b" ", 2)[1])
    except (IndexError, ValueError):
        raise WorkerUnavailable(f"not an HTTP response: {lines[0][:80]!r}") from None
    headers: dict[bytes, bytes] = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    return status, headers


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    while True:
        size_line = await reader.readuntil(b"\r\n")
        size = int(size_line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            await reader.readuntil(b"\r\n")  # no trailers expected: the final CRLF
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)
