"""Connection hygiene for uvicorn (R-API-9): a thin subclass of uvicorn's own httptools protocol
that applies the pure policy of `domain/security/connections.py`, for the worker and the front alike.

uvicorn 0.5x has a keep-alive timeout, but no timeout for a request head or body that does not
arrive, no limit on the size of a request head (httptools buffers a header of any size), no cap
on open connections that refuses cleanly (`limit_concurrency` answers 503 only after reading a
head, and keeps the socket), and it closes a connection whose client half-closed after sending a
full request, dropping the answer. This class adds exactly those, and nothing else:

- a head over `max_header_bytes` gets 431 (it is fed to the parser in slices, so no more than
  the limit is ever buffered); a head or body past its timeout gets 408; idle sockets are closed;
- at `max_connections` the longest-idle connection gives way, or the new one gets 503 with
  `Retry-After` and is closed within a second (`write_eof`, then close);
- a response the client stops reading is abandoned after `body_timeout`;
- a client that half-closes after a full request still gets its answer (then the connection
  closes), while one that closed and went away still has its request dropped;
- uvicorn's plain-text 400 for a malformed request is a JSON error like every other;
- paced reads (R-FAIR-5, `read_pacing.py`): once a key has bound a connection to a tenant, its
  next request is held unparsed while that tenant is over its share of the requests in progress,
  and read in its turn.

`bench/server_overhead.py` measures the per-request cost against the stock protocol.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Any, cast

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from vllm_srun.adapters.http.connection_guard import ConnectionGuard
from vllm_srun.adapters.http.errors import raw_error_response
from vllm_srun.adapters.http.read_pacing import CONNECTION_SCOPE_KEY
from vllm_srun.adapters.http.request_body import BODY_TIMED_OUT
from vllm_srun.domain.security.connections import Expiry

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
TCP_INFO = getattr(socket, "TCP_INFO", None)  # Linux: struct tcp_info, whose first byte is the state
TCP_CLOSE = 7
PEER_CHECK_S = 0.02
LINGER_S = 1.0  # a connection the guard answers itself (503, 408, 431) is closed this long after at most
# a TLS connection being closed is dropped after this long: asyncio's TLS close waits up to 30 s
# for the peer's close_notify, which an idle keep-alive client never sends until it reads again
# (it held every SIGTERM of a TLS server for 30 s)
TLS_CLOSE_S = 1.0


class GuardedProtocol(HttpToolsProtocol):
    guard: ConnectionGuard  # set on the per-listener subclass (`protocol_class`)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_bytes = 0
        self._reading_head = True  # between the end of one message and the end of the next head
        self._in_message = False
        self._closing = False  # the guard answered; what else arrives is dropped
        self._tls_drop: asyncio.TimerHandle | None = None
        self._tenant: str | None = None  # the tenant a key bound this connection to (R-FAIR-5)
        self._held: list[bytes] | None = None  # the next request's bytes while it waits its turn
        self._counted: str | None = None  # the tenant whose request in progress this connection holds

    # ---- connection ----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(cast(asyncio.Transport, transport))
        admission = self.guard.admit(self, self.loop)
        if admission.evicted is not None:
            admission.evicted.evict()
            self.guard.count("evicted")
        if not admission.admitted:
            self._refuse()

    def evict(self) -> None:
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.guard.forget(self)
        if self._held is not None and self._tenant is not None:
            self.guard.reads.forget(self, self._tenant)  # a request held unread was never ours: its client went
            self._held = None
        self._uncount()
        if self._tls_drop is not None:
            self._tls_drop.cancel()
        super().connection_lost(exc)

    def shutdown(self) -> None:
        super().shutdown()
        self._bound_tls_close()

    def _bound_tls_close(self) -> None:
        """A TLS connection that is closing is dropped after TLS_CLOSE_S if its peer has not
        answered the close by then (plain TCP closes at once)."""
        transport = self.transport
        if self._tls_drop is None and transport.is_closing() and transport.get_extra_info("sslcontext") is not None:
            self._tls_drop = self.loop.call_later(TLS_CLOSE_S, transport.abort)

    def _half_closed(self) -> bool | None:
        """The client sent FIN with a whole request in progress: it half-closed (and waits for
        the answer) or it closed and went away; TCP does not tell which. An interim `100
        Continue` tells: a client that closed answers it with a reset, so its request is dropped
        as before (499, no forward), while one that half-closed reads past it (clients must
        accept 1xx responses, RFC 9110 15.2) and gets its answer; then the connection closes."""
        cycle = self.cycle
        if self._closing or self._in_message or cycle is None or cycle.response_complete:
            return None  # nothing (whole) to answer: close
        if self.scope.get("http_version") != "1.1":
            return None  # no interim responses before HTTP/1.1: treat it as gone
        cycle.keep_alive = False
        if not cycle.response_started:
            cycle.waiting_for_100_continue = False
            self.transport.write(CONTINUE)
            self.loop.call_later(PEER_CHECK_S, self._check_peer)
        return True  # asyncio: keep the transport open for writing

    def _check_peer(self) -> None:
        """While a half-closed connection's request is in progress: a TCP peer that answered the
        interim response with a reset is gone (the socket is CLOSED, not CLOSE_WAIT) — drop its
        request. (A Unix-socket peer that is gone fails the write itself.)"""
        cycle = self.cycle
        if cycle is None or cycle.response_complete or self.transport.is_closing():
            return
        sock = self.transport.get_extra_info("socket")
        try:
            state = sock.getsockopt(socket.IPPROTO_TCP, TCP_INFO, 8)[0] if sock is not None and TCP_INFO else None
        except OSError:
            return  # not TCP
        if state == TCP_CLOSE:
            self.transport.abort()  # the application sees the disconnect and drops the request
        elif state is not None:
            self.loop.call_later(PEER_CHECK_S, self._check_peer)

    def _eof(self) -> bool | None:
        if self._held is not None and self._tenant is not None:
            self.guard.reads.forget(self, self._tenant)
            self.release()  # a request held for its turn is read now: the client may wait for it
        return self._half_closed()

    # uvicorn types `eof_received` as returning None (always close); asyncio's contract allows True
    eof_received = cast(Callable[..., None], _eof)

    def _refuse(self) -> None:
        self.guard.count("refused")
        self.guard.log_refusal()
        self._close_with(self.guard.refused)

    def _close_with(self, response: bytes) -> None:
        """Send RESPONSE and close, without a reset: half-close, drop what still arrives, close
        when the client does (or after LINGER_S). An application still reading sees a disconnect."""
        self._closing = True
        self.guard.table.close(self)
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # its reads end, its writes are dropped
            cycle.message_event.set()
        transport = self.transport
        transport.write(response)
        if transport.can_write_eof():
            transport.write_eof()
        self.loop.call_later(LINGER_S, transport.close)

    def expire(self, expiry: Expiry) -> None:
        """Called by the guard's timer for a connection past its deadline (already out of the table)."""
        if expiry is Expiry.SEND_TIMEOUT or self.transport.get_write_buffer_size():
            self.guard.count(Expiry.SEND_TIMEOUT.value)
            self.transport.abort()  # close() would wait, forever, for a client that does not read
            return
        self.guard.count(expiry.value)
        if expiry is Expiry.HEAD_TIMEOUT:
            self._close_with(self.guard.head_late)
        elif expiry is Expiry.BODY_TIMEOUT and self.cycle is not None and not self.cycle.response_started:
            cast(dict[str, Any], self.scope)[BODY_TIMED_OUT] = True  # read by request_body.read_body
            self._close_with(self.guard.body_late)
        else:
            self.transport.close()

    # ---- bytes in ----------------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        if self._held is not None:
            self._held.append(data)
            self.transport.pause_reading()
            return
        tenant = self._tenant
        if tenant is not None and not self._in_message and self.guard.reads.should_hold(tenant):
            self._held = [data]
            self.transport.pause_reading()  # what else the client sends stays in the kernel
            self._unset_keepalive_if_required()  # the request arrived: it is ours to read, not idle
            self.guard.table.held(self)
            self.guard.reads.hold(self, tenant, self.loop)
            return
        self._receive(data)

    def release(self) -> bool:
        """Its turn came (`read_pacing.PacedReads`): read the held request, counted in progress
        for the connection's tenant from now. False when the connection went meanwhile."""
        held, self._held = self._held, None
        if held is None or self._closing or self.transport.is_closing() or self._tenant is None:
            return False
        self._count(self._tenant)
        self.guard.table.read_resumed(self, self.loop.time())
        self.transport.resume_reading()
        self._receive(b"".join(held))
        return True

    def _receive(self, data: bytes) -> None:
        while data:
            if not self._reading_head:
                super().data_received(data)
                return
            room = self.guard.limits.max_header_bytes - self._head_bytes
            if room <= 0:
                self.guard.count("headers_too_large")
                self._close_with(self.guard.too_large)
                return
            piece, data = (data, b"") if len(data) <= room else (data[:room], data[room:])
            self._head_bytes += len(piece)
            super().data_received(piece)
            if self.transport.is_closing():
                return

    def send_400_response(self, msg: str) -> None:
        self.transport.write(raw_error_response("invalid_request", msg))
        self.transport.close()

    # ---- parser callbacks -------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        cast(dict[str, Any], self.scope)[CONNECTION_SCOPE_KEY] = self  # for `http/auth.py`'s middleware
        self._in_message = True
        self.guard.table.head_started(self, self.loop.time())

    def on_headers_complete(self) -> None:
        self._reading_head = False
        self.guard.table.head_done(self, self.loop.time())
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_message = False
        self._reading_head = True
        self._head_bytes = 0
        self.guard.table.body_done(self, self.loop.time())

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._uncount()
        self._bound_tls_close()  # the last response of a connection that will not be kept alive
        if self.transport.is_closing() or self.pipeline or not (self.cycle is None or self.cycle.response_complete):
            return
        now = self.loop.time()
        self.guard.table.answered(self, now)
        if self._in_message and self._reading_head:  # the next head has begun arriving
            self.guard.table.head_started(self, now)

    # ---- tenants (R-FAIR-5): reported by `http/auth.AuthMiddleware` --------------------------------
    def request_started(self, tenant: str, *, bind: bool) -> None:
        self._count(tenant)
        if bind:
            self._tenant = tenant

    def _count(self, tenant: str) -> None:
        """This connection's request is TENANT's, in progress until its response completes or
        the connection is lost (a held request is counted from when it is read)."""
        if self._counted == tenant:
            return
        self._uncount()
        self._counted = tenant
        self.guard.reads.started(tenant)

    def _uncount(self) -> None:
        tenant, self._counted = self._counted, None
        if tenant is not None:
            self.guard.reads.finished(tenant)

    # ---- bytes out ---------------------------------------------------------------------------------
    def pause_writing(self) -> None:
        super().pause_writing()
        self.guard.table.write_paused(self, self.loop.time())

    def resume_writing(self) -> None:
        super().resume_writing()
        self.guard.table.write_resumed(self)


def protocol_class(guard: ConnectionGuard) -> type[GuardedProtocol]:
    """uvicorn's `http=` protocol class for one listener, bound to its guard."""
    return type("GuardedHttpToolsProtocol", (GuardedProtocol,), {"guard": guard})


def uvicorn_config(app: Any, guard: ConnectionGuard, **kwargs: Any) -> uvicorn.Config:
    """A uvicorn config that serves APP through GUARD's protocol (uvloop, httptools)."""
    options: dict[str, Any] = {"loop": "uvloop", "access_log": False, **kwargs}
    options["http"] = protocol_class(guard)
    options["timeout_keep_alive"] = guard.limits.keep_alive_timeout_s  # uvicorn says int; call_later takes a float
    return uvicorn.Config(app, **options)
