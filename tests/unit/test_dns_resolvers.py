"""The resolvers of replicas found through DNS (`front/dns.py`): a given nameserver asked over
UDP (A and AAAA, NXDOMAIN, SERVFAIL, silence), the system resolver, and which one a replica's
`nameserver` means."""

from __future__ import annotations

import asyncio

import pytest

from tests.dns_server import DnsServer
from vllm_srun.adapters.front.dns import NameserverResolver, SystemResolver, resolver_for
from vllm_srun.domain.fleet.discovery import ResolutionFailed


def test_a_nameserver_gives_every_a_and_aaaa_record_and_follows_changes() -> None:
    with DnsServer() as server:
        resolver = resolver_for(server.nameserver)
        assert isinstance(resolver, NameserverResolver)
        server.records["workers.svc"] = ["10.1.0.7", "10.1.0.3", "fd00::0:5"]
        assert asyncio.run(resolver.resolve("Workers.svc.")) == ["10.1.0.3", "10.1.0.7", "fd00::5"]
        server.records["workers.svc"] = ["10.1.0.9"]
        assert asyncio.run(resolver.resolve("workers.svc")) == ["10.1.0.9"]
        assert asyncio.run(resolver.resolve("other.svc")) == []  # NXDOMAIN: no address (the caller decides)


def test_a_failing_or_silent_nameserver_is_a_resolution_failure_in_one_line() -> None:
    with DnsServer() as server:
        server.records["workers.svc"] = ["10.1.0.7"]
        server.failing = True
        with pytest.raises(ResolutionFailed, match="server failure"):
            asyncio.run(NameserverResolver("127.0.0.1", server.port).resolve("workers.svc"))
        server.failing, server.silent = False, True
        with pytest.raises(ResolutionFailed, match=f"no answer from 127.0.0.1:{server.port}") as caught:
            asyncio.run(NameserverResolver("127.0.0.1", server.port).resolve("workers.svc"))
        assert "\n" not in str(caught.value)


def test_the_system_resolver_answers_localhost_and_refuses_an_unknown_name() -> None:
    assert resolver_for(None).__class__ is SystemResolver
    assert "127.0.0.1" in asyncio.run(SystemResolver().resolve("localhost"))
    with pytest.raises(ResolutionFailed, match=r"nonexistent\.invalid"):
        asyncio.run(SystemResolver().resolve("nonexistent.invalid"))
