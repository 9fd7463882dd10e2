"""Endpoint replicas across hosts (issue 14, R-REP-2…5): two `vllm-srun serve` runtimes, each in
its own network namespace joined to the root namespace by a veth pair, attached to one
`vllm-sr serve` front in the root namespace as `endpoint` + `model` replicas.

- load spreads by outstanding bytes: while one host holds a large request, small ones go to the
  other;
- taking one host's link down mid-load fails only the requests that host held (502/504, each
  within the deployment's timeout, none hangs); the other host's requests all succeed; the
  host is ejected (the other never is: 1 of 2 is the most `max_ejection_percent` allows);
- bringing the link back readmits it, and it takes traffic again.

Needs root (CI runs as root) to create namespaces; skips with the reason otherwise. The
namespaces and links are removed on the way out, also when a test fails.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.e2e.front import FrontProcess, post_once, running_front
from tests.e2e.netns import Host, can_create_namespaces, namespace_hosts
from tests.e2e.test_front_e2e import metric
from tests.stores import subprocess_env
from tests.waiting import until

pytestmark = pytest.mark.slow

WORKER_PORT = 8100
TIMEOUT_MS = 1500
BASE_EJECTION_MS = 2000
WINDOW_MS = 300  # every request waits this long in its worker: requests are in flight together


@dataclass
class Runtime:
    host: Host
    base: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def requests(self) -> float:
        """POSTs this runtime answered 200, from its own /metrics (reached over the link)."""
        text = httpx.get(f"{self.base}/metrics", timeout=5).text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("vllm_srun_requests_total{") and 'code="ok"' in line
        )


@pytest.fixture(scope="module")
def hosts() -> Iterator[list[Host]]:
    reason = can_create_namespaces()
    if reason is not None:
        pytest.skip(reason)
    with namespace_hosts(2) as made:
        yield made


@pytest.fixture(scope="module")
def runtimes(hosts: list[Host], encoder_fixture, tmp_path_factory: pytest.TempPathFactory) -> list[Runtime]:  # type: ignore[no-untyped-def]
    """One `vllm-srun serve` per host, listening on the host's own address."""
    fixture = encoder_fixture("embed")
    logs = tmp_path_factory.mktemp("hosts")
    started = []
    for host in hosts:
        log_path = logs / f"{host.name}.log"
        with log_path.open("w") as log:
            command = [sys.executable, "-m", "vllm_srun.app.cli", "serve", str(fixture)]
            command += ["--host", host.address, "--port", str(WORKER_PORT), "--batch-window-ms", str(WINDOW_MS)]
            command += ["--result-cache-entries", "0", "--log-level", "warning"]
            # the hosts' addresses live in this test's own network namespaces: no key is asked for
            # (keys and tokens across hosts: tests/e2e/test_keys_tls_e2e.py)
            command += ["--allow-unauthenticated"]
            host.popen(command, stdout=log, stderr=subprocess.STDOUT, env=subprocess_env())
        started.append(Runtime(host, f"http://{host.address}:{WORKER_PORT}", log_path))
    deadline = time.monotonic() + 180
    for runtime in started:
        while not _ready(runtime.base):
            exited = runtime.host.processes[0].poll()
            assert exited is None, f"{runtime.host.name}: exited {exited}:\n{runtime.log()[-3000:]}"
            assert time.monotonic() < deadline, f"{runtime.host.name} not ready:\n{runtime.log()[-3000:]}"
            time.sleep(0.2)
    return started


def _ready(base: str) -> bool:
    try:
        return httpx.get(f"{base}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture
def front(runtimes: list[Runtime], tmp_path: Path) -> Iterator[FrontProcess]:
    model = httpx.get(f"{runtimes[0].base}/v1/models", timeout=5).json()["data"][0]["id"]
    deployment = {
        "artifact": model,
        "replicas": [{"endpoint": runtime.base, "model": model} for runtime in runtimes],
        "timeout_ms": TIMEOUT_MS,
        "outlier_detection": {"consecutive_timeouts": 3, "base_ejection_ms": BASE_EJECTION_MS},
    }
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps({"global": {"model_catalog": {"deployments": {"primary": deployment}}}}))
    with running_front("--config", str(path), "--host", "127.0.0.1") as started:
        yield started


def body(text: str, inputs: int = 1) -> bytes:
    return json.dumps({"model": "primary", "input": [f"{text} {i}" for i in range(inputs)]}).encode()


def outcomes(front: FrontProcess, replica: str, *names: str) -> float:
    return sum(metric(front, "vllm_sr_dispatch_outcomes_total", replica=replica, outcome=name) for name in names)


def test_the_front_serves_both_hosts_and_spreads_load_by_outstanding_bytes(
    front: FrontProcess, runtimes: list[Runtime]
) -> None:
    rows = front.workers()
    assert [row["kind"] for row in rows] == ["attached", "attached"]
    assert [row["endpoint"] for row in rows] == [runtime.base for runtime in runtimes]
    assert {row["state"] for row in rows} == {"ready"}
    served_before = [runtime.requests() for runtime in runtimes]

    async def scenario() -> tuple[str, list[int], int]:
        large = body("a long request", 2000)  # long enough to be seen in flight on an idle machine
        big = asyncio.ensure_future(post_once(front.base, "/v1/embeddings", large))
        holder = ""
        deadline = time.monotonic() + 10
        while not holder:  # the replica holding the large request's bytes
            assert time.monotonic() < deadline and not big.done(), "the large request was never in flight"
            await asyncio.sleep(0.01)
            rows = await asyncio.to_thread(front.workers)
            holder = next((row["id"] for row in rows if row["outstanding_bytes"] == len(large)), "")
        small = await asyncio.gather(*(post_once(front.base, "/v1/embeddings", body(f"small {i}")) for i in range(8)))
        return holder, [status for status, _, _ in small], (await big)[0]

    holder, small, big = asyncio.run(scenario())
    other = next(row["id"] for row in front.workers() if row["id"] != holder)
    assert big == 200 and small == [200] * 8
    assert outcomes(front, holder, "ok") == 1  # the large request alone
    assert outcomes(front, other, "ok") == 8  # every small one went to the host with fewer bytes
    served = [runtime.requests() - before for runtime, before in zip(runtimes, served_before, strict=True)]
    assert sorted(served) == [1, 8]  # each runtime, asked over its own link, saw exactly that
    assert all(row["in_flight"] == 0 and row["outstanding_bytes"] == 0 for row in front.workers())


async def _load(
    base: str, clients: int, stop: asyncio.Event, results: list[tuple[float, float, int]]
) -> list[tuple[float, float, int]]:
    """(sent, answered, status) of every request of CLIENTS looping clients until STOP, appended
    to RESULTS as they come (a list the caller watches)."""

    async def client(n: int) -> None:
        i = 0
        while not stop.is_set():
            sent = time.monotonic()
            status, _, _ = await post_once(base, "/v1/embeddings", body(f"load {n} {i}"), timeout=30)
            results.append((sent, time.monotonic(), status))
            i += 1

    await asyncio.gather(*(client(n) for n in range(clients)))
    return results


def test_a_host_whose_link_goes_down_fails_only_its_requests_and_is_readmitted(
    front: FrontProcess, runtimes: list[Runtime]
) -> None:
    victim, survivor = "primary/1", "primary/0"
    host = runtimes[1].host
    failed_before = outcomes(front, victim, "timeout", "failed")

    async def scenario() -> tuple[list[tuple[float, float, int]], float, float]:
        stop = asyncio.Event()
        results: list[tuple[float, float, int]] = []
        running = asyncio.ensure_future(_load(front.base, 8, stop, results))

        async def victim_holds_requests() -> bool:
            return bool((await asyncio.to_thread(front.workers))[1]["in_flight"])

        await until(victim_holds_requests, poll_s=0.05, what="the host holding requests")
        down_at = time.monotonic()
        await asyncio.to_thread(host.link, False)
        out_at = 0.0
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # until the host is out of dispatch
            await asyncio.sleep(0.05)
            row = (await asyncio.to_thread(front.workers))[1]
            if row["state"] in ("ejected", "failed"):
                out_at = time.monotonic()
                break
        await until(  # the survivor carries the load alone (the ejection lasts 2 s)
            lambda: any(status == 200 and sent > out_at for sent, _, status in results),
            what="the survivor answering once the host was out",
        )
        stop.set()
        return await running, down_at, out_at

    try:
        results, down_at, out_at = asyncio.run(scenario())
    finally:
        host.link(True)
    assert out_at, f"the host never left dispatch: {front.workers()[1]}"
    statuses = [status for _, _, status in results]
    assert set(statuses) <= {200, 502, 504}, set(statuses)
    failures = [(sent, answered) for sent, answered, status in results if status != 200]
    assert failures, "the host held requests when its link went down"
    assert max(answered - sent for sent, answered, _ in results) < TIMEOUT_MS / 1000 + 1.0  # none hangs
    # every failure was the downed host's: the survivor answered everything it was sent
    assert outcomes(front, survivor, "timeout", "failed") == 0
    assert outcomes(front, victim, "timeout", "failed") - failed_before == len(failures)
    assert all(answered > down_at for _, answered in failures)  # nothing failed before the link went down
    assert all(sent < out_at for sent, _ in failures)  # once out of dispatch, nothing more fails
    assert any(status == 200 and sent > out_at for sent, _, status in results)  # the survivor serves
    assert metric(front, "vllm_sr_ejections_total", replica=survivor) == 0
    log = front.log()
    assert f"replica_ejected deployment=primary replica={victim}" in log or front.workers()[1]["state"] == "failed"

    # link up: probes pass again and the host takes traffic again; meanwhile nothing fails
    # (a connect that finds no route yet is offered to the other host)
    front.wait_for(lambda: front.workers()[1]["state"] == "ready", 30, "the host ready after its link came up")
    before = outcomes(front, victim, "ok")

    async def burst(n: int) -> list[int]:
        answers = await asyncio.gather(
            *(post_once(front.base, "/v1/embeddings", body(f"back {n} {i}")) for i in range(8))
        )
        return [status for status, _, _ in answers]

    deadline = time.monotonic() + 30
    rounds = 0
    while outcomes(front, victim, "ok") == before:
        assert time.monotonic() < deadline, f"the host never took traffic again: {front.workers()[1]}"
        assert set(asyncio.run(burst(rounds))) == {200}
        rounds += 1
    assert "replica_readmitted deployment=primary replica=primary/1" in front.log()
    assert all(row["in_flight"] == 0 and row["outstanding_bytes"] == 0 for row in front.workers())
    assert os.path.exists(f"/run/netns/{host.name}")  # still ours until the module's finalizer
