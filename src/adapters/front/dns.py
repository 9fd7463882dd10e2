"""Resolvers for replicas found through DNS (`domain/fleet/discovery.py`'s `AddressResolver` port).

- `SystemResolver`: the system's resolver (`getaddrinfo` on the event loop's executor, so
  /etc/hosts, search domains and the cluster DNS of a pod apply); every A and AAAA address.
- `NameserverResolver`: asks one DNS server directly over UDP (`nameserver: HOST:PORT` in the
  replica's config): A and AAAA queries, answers read from the answer section. For a server the
  system resolver does not use (and for tests, which start their own).

Addresses are spelled one way (`ipaddress` normal form), so a set of them compares as it should.
"""

from __future__ import annotations

import asyncio
import ipaddress
import random
import socket
import struct
from urllib.parse import urlsplit

from vllm_srun.domain.fleet.discovery import AddressResolver, ResolutionFailed

QUERY_TIMEOUT_S = 2.0
TYPE_A, TYPE_AAAA = 1, 28
RCODES = {1: "format error", 2: "server failure", 3: "no such name", 4: "not implemented", 5: "refused"}


class SystemResolver:
    """Every address the system's resolver gives NAME."""

    async def resolve(self, name: str) -> list[str]:
        loop = asyncio.get_running_loop()
        try:
            infos = await asyncio.wait_for(loop.getaddrinfo(name, None, type=socket.SOCK_STREAM), QUERY_TIMEOUT_S * 2)
        except TimeoutError:
            raise ResolutionFailed(f"{name}: no answer within {QUERY_TIMEOUT_S * 2:g} s") from None
        except OSError as exc:
            raise ResolutionFailed(f"{name}: {exc.strerror or exc}") from None
        return sorted({_normal(str(info[4][0])) for info in infos})


class NameserverResolver:
    """Every A and AAAA address the DNS server at HOST:PORT gives NAME."""

    def __init__(self, host: str, port: int = 53) -> None:
        self.host, self.port = host, port

    async def resolve(self, name: str) -> list[str]:
        answers = await asyncio.gather(
            asyncio.to_thread(self._query, name, TYPE_A), asyncio.to_thread(self._query, name, TYPE_AAAA)
        )
        return sorted({address for answer in answers for address in answer})

    def _query(self, name: str, qtype: int) -> list[str]:
        ident = random.getrandbits(16)
        question = b"".join(bytes([len(p)]) + p.encode("idna") for p in name.rstrip(".").split(".")) + b"\0"
        packet = struct.pack("!HHHHHH", ident, 0x0100, 1, 0, 0, 0) + question + struct.pack("!HH", qtype, 1)
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.settimeout(QUERY_TIMEOUT_S)
            try:
                sock.sendto(packet, (self.host, self.port))
                while True:
                    reply = sock.recv(4096)
                    if len(reply) >= 12 and struct.unpack("!H", reply[:2])[0] == ident:
                        break
            except TimeoutError:
                raise ResolutionFailed(
                    f"{name}: no answer from {self.host}:{self.port} within {QUERY_TIMEOUT_S:g} s"
                ) from None
            except OSError as exc:
                raise ResolutionFailed(f"{name}: cannot ask {self.host}:{self.port}: {exc.strerror or exc}") from None
        return _answers(reply, name, qtype)


def resolver_for(nameserver: str | None) -> AddressResolver:
    """The resolver a replica's `nameserver` (HOST:PORT, [V6]:PORT or HOST) asks for: that
    server, or the system's resolver when None."""
    if nameserver is None:
        return SystemResolver()
    url = urlsplit(f"//{nameserver}")
    return NameserverResolver(url.hostname or nameserver, url.port or 53)


def _answers(reply: bytes, name: str, qtype: int) -> list[str]:
    """The addresses of QTYPE in a DNS reply; ResolutionFailed for an error code."""
    try:
        _, flags, questions, count, _, _ = struct.unpack("!HHHHHH", reply[:12])
        rcode = flags & 0xF
        if rcode == 3:
            return []  # no such name: the other record type may still have it; none at all fails later
        if rcode:
            raise ResolutionFailed(f"{name}: the server answered {RCODES.get(rcode, f'rcode {rcode}')}")
        offset = 12
        for _ in range(questions):
            offset = _skip_name(reply, offset) + 4
        out = []
        for _ in range(count):
            offset = _skip_name(reply, offset)
            rtype, _, _, length = struct.unpack("!HHIH", reply[offset : offset + 10])
            data = reply[offset + 10 : offset + 10 + length]
            offset += 10 + length
            if rtype == qtype == TYPE_A and length == 4:
                out.append(str(ipaddress.IPv4Address(data)))
            elif rtype == qtype == TYPE_AAAA and length == 16:
                out.append(str(ipaddress.IPv6Address(data)))
        return out
    except (struct.error, IndexError, ValueError) as exc:
        raise ResolutionFailed(f"{name}: a malformed DNS reply ({exc})") from None


def _skip_name(reply: bytes, offset: int) -> int:
    """The offset just past the (possibly compressed) name at OFFSET."""
    while True:
        length = reply[offset]
        if length == 0:
            return offset + 1
        if length & 0xC0 == 0xC0:
            return offset + 2
        offset += 1 + length


def _normal(address: str) -> str:
    return str(ipaddress.ip_address(address.split("%", 1)[0]))
