"""Replicas found through DNS at the front (issue 26): a deployment's `{dns, port, model}`
replica follows the name's records while requests flow (0 failed requests while replicas come
and go), keeps its last good set through a failing nameserver (one log line, a counter), and a
reload keeps what it found; an endpoint replica that cannot be reached says why in /health
(issue 27). Fake workers on loopback addresses 127.0.0.1-3, one port; the test's own DNS server
(`tests/dns_server.py`)."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections import Counter
from typing import Any

import pytest

from tests.dns_server import DnsServer
from tests.fake_worker import FakeWorker
from tests.integration.test_front_proxy import Front, config_for, scenario
from tests.prometheus_text import metric
from tests.waiting import until

NAME = "workers.test"
HOSTS = ("127.0.0.1", "127.0.0.2", "127.0.0.3")


def dns_deployment(server: DnsServer, port: int, **fields: Any) -> dict[str, Any]:
    replica = {
        "dns": NAME,
        "port": port,
        "model": "fake-model",
        "resolve_every_ms": 100,
        "nameserver": server.nameserver,
    }
    return {"artifact": "fake-artifact", "replicas": [replica], "result_cache_entries": 0, **fields}


async def workers_on_one_port() -> list[FakeWorker]:
    first = await FakeWorker(name=HOSTS[0], host=HOSTS[0]).start()
    rest = [await FakeWorker(name=h, host=h, port=first.port).start() for h in HOSTS[1:]]
    return [first, *rest]


def endpoints(front: Front) -> dict[str, str]:
    """Serving replica id -> endpoint (the front's inventory, as a user reads it)."""
    return {h.id: h.placement.endpoint or "" for h in front.fleet.deployments["primary"].handles.values()}


class Load:
    """CONCURRENCY clients posting in a loop; every answer's status counted, and which worker answered."""

    def __init__(self, front: Front, concurrency: int = 4) -> None:
        self.front, self.statuses, self.answered_by = front, Counter[int](), Counter[str]()
        self._tasks = [asyncio.ensure_future(self._client()) for _ in range(concurrency)]
        self._stop = False

    async def _client(self) -> None:
        while not self._stop:
            r = await self.front.post({"model": "primary", "input": "load"})
            self.statuses[r.status_code] += 1
            if r.status_code == 200:
                self.answered_by[r.json()["worker"]] += 1

    async def stop(self) -> None:
        self._stop = True
        await asyncio.gather(*self._tasks)


def test_replicas_follow_the_records_under_load_with_no_failed_request(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="vllm_srun.front")

    async def go() -> None:
        workers = await workers_on_one_port()
        with DnsServer() as server:
            server.records[NAME] = list(HOSTS[:2])
            async with Front(config_for({"primary": dns_deployment(server, workers[0].port)})) as front:
                await front.ready("primary", 2)
                load = Load(front)
                await until(lambda: load.answered_by[HOSTS[0]] and load.answered_by[HOSTS[1]], what="both answer")
                server.records[NAME] = list(HOSTS)  # scale up: the third is added once its /health answers
                await front.ready("primary", 3)
                await until(lambda: load.answered_by[HOSTS[2]] > 0, what="the new replica to take requests")
                server.records[NAME] = list(HOSTS[1:])  # scale down: the first drains, then leaves
                await until(
                    lambda: f"http://{HOSTS[0]}:{workers[0].port}" not in endpoints(front).values(), what="drain"
                )
                after_drain = len(workers[0].received)
                await workers[0].stop()  # gone for good once drained: no request may have been left on it
                await until(lambda: sum(load.statuses.values()) > 40 + after_drain, what="more requests")
                server.records[NAME] = list(HOSTS[1:])
                await load.stop()
                assert set(load.statuses) == {200}, load.statuses  # 0 failed requests while replicas came and went
                assert len(workers[0].received) == after_drain  # nothing was sent to it after its drain
                assert sorted(endpoints(front).values()) == [f"http://{h}:{workers[0].port}" for h in HOSTS[1:]]
                text = (await front.client.get("/metrics")).text
                assert metric(text, "vllm_sr_discovered_replicas", deployment="primary", dns=NAME) == 2
        for worker in workers[1:]:
            await worker.stop()

    scenario(go)
    lines = [r.getMessage() for r in caplog.records]
    assert any(line.startswith("replica_draining deployment=primary") for line in lines), lines
    assert any(
        line.startswith("dns_replicas_changed deployment=primary") and "added=127.0.0.3" in line for line in lines
    )


def test_a_vanished_replica_answers_what_it_holds_before_it_leaves(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="vllm_srun.front")

    async def go() -> None:
        workers = await workers_on_one_port()
        with DnsServer() as server:
            server.records[NAME] = [HOSTS[0]]
            async with Front(config_for({"primary": dns_deployment(server, workers[0].port)})) as front:
                await front.ready("primary", 1)
                held = [asyncio.ensure_future(front.post({"model": "primary", "input": "slow:1"})) for _ in range(3)]
                await until(lambda: len(workers[0].received) == 3, what="three requests held by the first worker")
                server.records[NAME] = [HOSTS[1]]
                await front.ready("primary", 1)
                answers = await asyncio.gather(*held)
                assert [(r.status_code, r.json()["worker"]) for r in answers] == [(200, HOSTS[0])] * 3
                await until(lambda: len(endpoints(front)) == 1, what="the drained replica to leave")
                r = await front.post({"model": "primary", "input": "after"})
                assert r.status_code == 200 and r.json()["worker"] == HOSTS[1]
        for worker in workers:
            await worker.stop()

    scenario(go)
    lines = [r.getMessage() for r in caplog.records]
    draining = next(i for i, line in enumerate(lines) if line.startswith("replica_draining deployment=primary"))
    retired = next(i for i, line in enumerate(lines) if line.startswith("replica_retired deployment=primary"))
    assert "in_flight=3" in lines[draining] and draining < retired and lines[retired].endswith("in_flight=0")


def test_a_failing_nameserver_keeps_the_last_good_set_and_says_so_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="vllm_srun.front")

    async def go() -> None:
        workers = await workers_on_one_port()
        with DnsServer() as server:
            server.records[NAME] = list(HOSTS[:2])
            async with Front(config_for({"primary": dns_deployment(server, workers[0].port)})) as front:
                await front.ready("primary", 2)
                server.failing = True

                async def three_failures() -> bool:
                    text = (await front.client.get("/metrics")).text
                    return (metric(text, "vllm_sr_dns_resolution_failures_total", deployment="primary") or 0) >= 3

                await until(three_failures, what="three failed resolutions counted")
                assert front.fleet.deployments["primary"].ready_count() == 2  # the last good set serves on
                assert (await front.post({"model": "primary", "input": "x"})).status_code == 200
                del server.records[NAME]
                server.failing = False  # NXDOMAIN: an empty answer keeps the set too
                before = server.queries
                await until(lambda: server.queries > before + 4, what="more resolutions")
                assert front.fleet.deployments["primary"].ready_count() == 2
                server.records[NAME] = [HOSTS[1]]
                await until(lambda: len(endpoints(front)) == 1, what="the recovered answer to apply")
        for worker in workers:
            await worker.stop()

    scenario(go)
    failing = [r for r in caplog.records if r.getMessage().startswith("dns_resolution_failing")]
    assert len(failing) == 1 and failing[0].levelno == logging.WARNING, [r.getMessage() for r in failing]
    assert (
        "server failure" in failing[0].getMessage()
        and "keeping the last good set (2 replicas)" in failing[0].getMessage()
    )
    assert len([r for r in caplog.records if r.getMessage().startswith("dns_resolution_recovered")]) == 1


def test_a_reload_keeps_the_replicas_found_through_dns() -> None:
    async def go() -> None:
        workers = await workers_on_one_port()
        with DnsServer() as server:
            server.records[NAME] = list(HOSTS[:2])
            spec = dns_deployment(server, workers[0].port)
            other = {
                "artifact": "fake-artifact",
                "replicas": [{"endpoint": workers[2].endpoint, "model": "fake-model"}],
            }
            config = config_for({"primary": spec})
            async with Front(config) as front:
                await front.ready("primary", 2)
                found = endpoints(front)
                front.reconfigurer.load = lambda: config_for({"primary": spec, "other": other})
                status = await front.reconfigurer.reload()
                assert status.state == "done" and sorted(status.kept) == sorted(found), status.describe()
                assert endpoints(front) == found and front.fleet.deployments["primary"].ready_count() == 2
                server.records[NAME] = [HOSTS[0]]  # the carried-over watcher still follows the name
                await until(lambda: len(endpoints(front)) == 1, what="the reloaded deployment to follow the name")
        for worker in workers:
            await worker.stop()

    scenario(go)


def test_an_unreachable_endpoint_says_why_in_health_and_logs_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="vllm_srun.front")

    async def go() -> None:
        with socket.socket() as spare:  # a port nobody listens on
            spare.bind(("127.0.0.1", 0))
            dead = f"http://127.0.0.1:{spare.getsockname()[1]}"
        config = config_for({"down": {"artifact": "x", "replicas": [{"endpoint": dead, "model": "m"}]}})
        async with Front(config) as front:

            async def reason() -> str | None:
                body = (await front.client.get("/health")).json()
                (replica,) = body["deployments"]["down"]["not_ready"]
                return replica["reason"]

            found = await until(reason, what="a reason in /health")
            assert "cannot connect" in found and dead.removeprefix("http://") in found
            inventory = (await front.client.get("/api/v1/inventory")).json()
            assert inventory["deployments"][0]["workers"][0]["reason"]

    scenario(go)
    unreachable = [r for r in caplog.records if r.getMessage().startswith("replica_unreachable deployment=down")]
    assert len(unreachable) == 1 and "cannot connect" in unreachable[0].getMessage()
