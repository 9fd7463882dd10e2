"""A tiny DNS server for tests: UDP on loopback, answers A and AAAA queries from a table the test
changes while it runs (`server.records["workers.test"] = ["127.0.0.2", "127.0.0.3"]`).

A name not in the table is answered NXDOMAIN; `failing = True` answers SERVFAIL to everything;
`silent = True` answers nothing (a resolver times out). Runs on a thread of its own, so it
answers whatever the test's event loop is doing.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
import threading
from types import TracebackType


class DnsServer:
    def __init__(self) -> None:
        self.records: dict[str, list[str]] = {}
        self.failing = False
        self.silent = False
        self.queries = 0
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.settimeout(0.1)
        self.port = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def nameserver(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> DnsServer:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()
        self._sock.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                query, peer = self._sock.recvfrom(512)
            except TimeoutError:
                continue
            self.queries += 1
            if not self.silent:
                self._sock.sendto(self._answer(query), peer)

    def _answer(self, query: bytes) -> bytes:
        ident = query[:2]
        labels, offset = [], 12
        while query[offset]:
            length = query[offset]
            labels.append(query[offset + 1 : offset + 1 + length].decode())
            offset += 1 + length
        question = query[12 : offset + 5]
        qtype = struct.unpack("!H", query[offset + 1 : offset + 3])[0]
        name = ".".join(labels).lower()
        if self.failing or name not in self.records:
            rcode = 2 if self.failing else 3
            return ident + struct.pack("!HHHHH", 0x8180 | rcode, 1, 0, 0, 0) + question
        answers = []
        for text in list(self.records[name]):
            address = ipaddress.ip_address(text)
            rtype = 1 if address.version == 4 else 28
            if rtype == qtype:  # a pointer to the question's name, type, class IN, TTL 0, the address
                answers.append(struct.pack("!HHHIH", 0xC00C, rtype, 1, 0, len(address.packed)) + address.packed)
        return ident + struct.pack("!HHHHH", 0x8180, 1, len(answers), 0, 0) + question + b"".join(answers)
