"""Replicas found through DNS, out of process (issue 26, R-OPS-1): a `vllm-sr serve` front whose
deployment is `{dns, port, model}` follows the records of a DNS server this test runs, while
clients post to it: a replica added to the records takes requests once its /health answers, one
removed drains and leaves, and no request fails while replicas come and go.

Three `vllm-srun serve` workers listen on 127.0.0.1-3 on one port (loopback addresses, so no
network namespace is needed); the nameserver is `tests/dns_server.py` on a thread of the test.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.dns_server import DnsServer
from tests.e2e.front import FrontProcess, post_once, running_front
from tests.e2e.server import free_port
from tests.logs import log_path
from tests.stores import subprocess_env
from tests.waiting import until

pytestmark = pytest.mark.slow

NAME = "workers.dns.test"
HOSTS = ("127.0.0.1", "127.0.0.2", "127.0.0.3")


def served(base: str) -> float:
    """POSTs this worker answered 200, from its own /metrics."""
    text = httpx.get(f"{base}/metrics", timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm_srun_requests_total{") and 'code="ok"' in line
    )


@dataclass
class Workers:
    port: int
    processes: dict[str, subprocess.Popen[bytes]]  # host -> its `vllm-srun serve`


@pytest.fixture(scope="module")
def workers(encoder_fixture) -> Iterator[Workers]:  # type: ignore[no-untyped-def]
    """One `vllm-srun serve` per loopback address, all on one port."""
    fixture = encoder_fixture("embed")
    port = free_port()
    started: dict[str, subprocess.Popen[bytes]] = {}
    logs: dict[str, Path] = {}
    try:
        for host in HOSTS:
            logs[host] = log_path(f"vllm-srun-dns-{host}.log")
            with logs[host].open("w") as log:
                command = [sys.executable, "-m", "vllm_srun.app.cli", "serve", str(fixture), "--host", host]
                command += ["--port", str(port), "--result-cache-entries", "0", "--log-level", "warning"]
                started[host] = subprocess.Popen(
                    command, stdout=log, stderr=subprocess.STDOUT, env=subprocess_env(), start_new_session=True
                )
        deadline = time.monotonic() + 180
        for host, proc in started.items():
            while not _ready(f"http://{host}:{port}"):
                assert proc.poll() is None, f"{host}: exited {proc.returncode}:\n{logs[host].read_text()[-3000:]}"
                assert time.monotonic() < deadline, f"{host} not ready:\n{logs[host].read_text()[-3000:]}"
                time.sleep(0.2)
        yield Workers(port, started)
    finally:
        for proc in started.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in started.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _ready(base: str) -> bool:
    try:
        return httpx.get(f"{base}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def endpoints(front: FrontProcess) -> list[str]:
    return sorted(row["endpoint"] for row in front.workers() if row["state"] == "ready")


async def load(base: str, clients: int, stop: asyncio.Event, statuses: Counter[int]) -> None:
    async def client(n: int) -> None:
        i = 0
        while not stop.is_set():
            body = json.dumps({"model": "primary", "input": f"dns load {n} {i}"}).encode()
            status, _, _ = await post_once(base, "/v1/embeddings", body, timeout=30)
            statuses[status] += 1
            i += 1

    await asyncio.gather(*(client(n) for n in range(clients)))


def test_replicas_come_and_go_with_the_records_and_no_request_fails(workers: Workers, tmp_path: Path) -> None:
    port = workers.port
    bases = {host: f"http://{host}:{port}" for host in HOSTS}
    model = httpx.get(f"{bases[HOSTS[0]]}/v1/models", timeout=5).json()["data"][0]["id"]
    with DnsServer() as nameserver:
        nameserver.records[NAME] = list(HOSTS[:2])
        replica = {"dns": NAME, "port": port, "model": model, "resolve_every_ms": 200}
        replica["nameserver"] = nameserver.nameserver
        deployment = {"artifact": model, "replicas": [replica]}
        config = tmp_path / "config.yaml"
        config.write_text(json.dumps({"global": {"model_catalog": {"deployments": {"primary": deployment}}}}))
        with running_front("--config", str(config), "--host", "127.0.0.1") as front:
            front.wait_for(lambda: endpoints(front) == [bases[h] for h in HOSTS[:2]], 30, "the first two replicas")
            before = {host: served(base) for host, base in bases.items()}

            async def scenario() -> tuple[Counter[int], float, float]:
                stop, statuses = asyncio.Event(), Counter[int]()
                running = asyncio.ensure_future(load(front.base, 6, stop, statuses))

                async def answered_by(host: str) -> bool:
                    return await asyncio.to_thread(served, bases[host]) > before[host]

                await until(lambda: answered_by(HOSTS[0]), timeout=60, poll_s=0.2, what="the first replica to answer")
                await until(lambda: answered_by(HOSTS[1]), timeout=60, poll_s=0.2, what="the second replica to answer")
                nameserver.records[NAME] = list(HOSTS)  # scale up: the third joins once its /health answers
                await until(
                    lambda: answered_by(HOSTS[2]), timeout=60, poll_s=0.2, what="the new replica to take requests"
                )
                nameserver.records[NAME] = list(HOSTS[1:])  # scale down: the first drains, then leaves

                async def first_left() -> bool:
                    return bases[HOSTS[0]] not in await asyncio.to_thread(endpoints, front)

                await until(first_left, timeout=60, poll_s=0.2, what="the vanished replica to drain and leave")
                at_drain = await asyncio.to_thread(served, bases[HOSTS[0]])
                workers.processes[HOSTS[0]].send_signal(signal.SIGTERM)  # gone for good, as a scaled-down pod is
                counted = sum(statuses.values())
                await until(lambda: sum(statuses.values()) > counted + 30, timeout=60, poll_s=0.2, what="more requests")
                stop.set()
                await running
                return statuses, at_drain, await asyncio.to_thread(served, bases[HOSTS[2]])

            statuses, _, third = asyncio.run(scenario())
            assert set(statuses) == {200}, statuses  # 0 failed requests while replicas came and went
            assert third > before[HOSTS[2]]
            assert endpoints(front) == [bases[h] for h in HOSTS[1:]]
            log = front.log()
            assert "dns_replicas_changed deployment=primary" in log, log[-3000:]
            assert "replica_draining deployment=primary" in log, log[-3000:]
