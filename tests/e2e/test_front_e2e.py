"""`vllm-sr serve` with real worker processes on loopback (R-REP-3…5, R-API-9, graceful drain):
a killed worker fails its requests fast and rejoins; a stopped one is ejected and readmitted;
256 clients on one worker get only 200 or 429; SIGTERM drains."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest

from tests.e2e.front import FrontProcess, post_once, running_front
from tests.waiting import until

pytestmark = pytest.mark.slow


def body(text: str, **extra: object) -> bytes:
    return json.dumps({"model": "primary", "input": text, **extra}).encode()


def metric(front: FrontProcess, name: str, **labels: str) -> float:
    text = httpx.get(f"{front.base}/metrics", timeout=5).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def load(
    base: str, clients: int, stop: asyncio.Event, tag: str, results: list[tuple[float, float, int]] | None = None
) -> list[tuple[float, float, int]]:
    """(sent, answered, status) of every request of `clients` looping clients until `stop`, in
    RESULTS as they come (a list the caller watches) and returned."""
    results = [] if results is None else results

    async def client(n: int) -> None:
        i = 0
        while not stop.is_set():
            sent = time.monotonic()
            status, _, _ = await post_once(base, "/v1/embeddings", body(f"{tag} {n} {i}"), timeout=20)
            results.append((sent, time.monotonic(), status))
            i += 1

    await asyncio.gather(*(client(n) for n in range(clients)))
    return results


async def worker_in_flight(front: FrontProcess, worker: int = 0) -> int:
    """The requests the front has on WORKER now (its inventory, read off the event loop)."""
    rows = await asyncio.to_thread(front.workers)
    return int(rows[worker]["in_flight"])


def in_flight_is(front: FrontProcess, count: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return await worker_in_flight(front) == count

    return check


def draining(front: FrontProcess) -> bool:
    return "SIGTERM: draining" in front.log()


def config_file(tmp_path: Path, fixture: Path, **fields: object) -> str:
    deployment = {
        "artifact": str(fixture),
        "replicas": [{"device": "cpu"}, {"device": "cpu"}],
        "result_cache_entries": 0,
        **fields,
    }
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps({"global": {"model_catalog": {"deployments": {"primary": deployment}}}}))
    return str(path)


def test_a_killed_worker_fails_fast_and_rejoins(encoder_fixture) -> None:  # type: ignore[no-untyped-def]
    fixture = encoder_fixture("embed")
    args = (str(fixture), "--platform", "cpu", "-dp", "2", "--result-cache-entries", "0", "--batch-window-ms", "300")
    with running_front(*args) as front:
        victim = front.workers()[0]
        assert {w["state"] for w in front.workers()} == {"ready"} and victim["threads"] >= 1

        async def scenario() -> tuple[list[tuple[float, float, int]], float]:
            stop = asyncio.Event()
            results: list[tuple[float, float, int]] = []
            running = asyncio.ensure_future(load(front.base, 8, stop, "kill", results))
            await until(lambda: worker_in_flight(front), poll_s=0.05, what="the victim holding requests")
            killed_at = time.monotonic()
            os.kill(victim["pid"], signal.SIGKILL)
            await until(
                lambda: any(status == 200 and sent > killed_at + 0.2 for sent, _, status in results),
                what="the other worker answering after the kill",
            )
            stop.set()
            return await running, killed_at

        results, killed_at = asyncio.run(scenario())
        statuses = {status for _, _, status in results}
        assert statuses <= {200, 502}, statuses
        failed = [(sent, answered) for sent, answered, status in results if status == 502]
        assert failed, "the killed worker held requests"
        assert all(answered - killed_at < 1.0 for _, answered in failed)  # no hang
        assert max(answered - sent for sent, answered, _ in results) < 5.0
        assert any(status == 200 and sent > killed_at + 0.2 for sent, _, status in results)  # the other serves

        def rejoined() -> bool:
            row = front.workers()[0]
            return row["state"] == "ready" and row["restarts"] == 1 and row["pid"] not in (None, victim["pid"])

        front.wait_for(rejoined, 60, "the killed worker restarted and ready")
        assert metric(front, "vllm_sr_replica_restarts_total", replica="primary/0") == 1
        before = metric(front, "vllm_sr_dispatch_outcomes_total", replica="primary/0", outcome="ok")

        async def burst() -> list[int]:
            return [
                s
                for s, _, _ in await asyncio.gather(
                    *(post_once(front.base, "/v1/embeddings", body(f"after {i}")) for i in range(16))
                )
            ]

        assert set(asyncio.run(burst())) == {200}
        assert metric(front, "vllm_sr_dispatch_outcomes_total", replica="primary/0", outcome="ok") > before
        assert all(w["in_flight"] == 0 and w["outstanding_bytes"] == 0 for w in front.workers())
        assert "replica_exited deployment=primary replica=primary/0" in front.log()


def test_a_stopped_worker_is_ejected_then_readmitted(encoder_fixture, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    fixture = encoder_fixture("embed")
    config = config_file(
        tmp_path, fixture, timeout_ms=400, outlier_detection={"consecutive_timeouts": 3, "base_ejection_ms": 1500}
    )
    with running_front("--config", config) as front:
        victim = front.workers()[1]
        os.kill(victim["pid"], signal.SIGSTOP)
        try:

            async def scenario() -> list[tuple[float, float, int]]:
                stop = asyncio.Event()
                running = asyncio.ensure_future(load(front.base, 4, stop, "stop"))
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline:
                    await asyncio.sleep(0.1)
                    rows = await asyncio.to_thread(front.workers)
                    if rows[1]["state"] == "ejected":
                        break
                stop.set()
                return await running

            results = asyncio.run(scenario())
            assert front.workers()[1]["state"] == "ejected", front.workers()[1]
        finally:
            os.kill(victim["pid"], signal.SIGCONT)
        statuses = {status for _, _, status in results}
        assert statuses <= {200, 504} and 504 in statuses and 200 in statuses
        assert max(answered - sent for sent, answered, _ in results) < 2.0  # 504 at timeout_ms, never a hang
        assert "replica_ejected deployment=primary replica=primary/1" in front.log()
        assert metric(front, "vllm_sr_ejections_total", replica="primary/1") >= 1
        front.wait_for(lambda: front.workers()[1]["state"] == "ready", 30, "ready after SIGCONT")
        front.wait_for(
            lambda: metric(front, "vllm_sr_readmissions_total", replica="primary/1") >= 1,
            10,
            "the readmission counted (the ejection clock ticks every 0.25 s)",
        )
        assert re.search(r"replica_readmitted deployment=primary replica=primary/1", front.log())

        async def burst() -> list[int]:
            return [
                s
                for s, _, _ in await asyncio.gather(
                    *(post_once(front.base, "/v1/embeddings", body(f"back {i}")) for i in range(16))
                )
            ]

        before = metric(front, "vllm_sr_dispatch_outcomes_total", replica="primary/1", outcome="ok")
        assert set(asyncio.run(burst())) == {200}
        assert metric(front, "vllm_sr_dispatch_outcomes_total", replica="primary/1", outcome="ok") > before


def test_256_clients_on_one_worker_get_200_or_429_and_none_is_lost(encoder_fixture) -> None:  # type: ignore[no-untyped-def]
    fixture = encoder_fixture("embed")
    with running_front(str(fixture), "--platform", "cpu", "--result-cache-entries", "0") as front:
        worker_pid = front.workers()[0]["pid"]

        async def scenario() -> list[tuple[int, dict[str, str], bytes]]:
            os.kill(worker_pid, signal.SIGSTOP)  # the first 32 stay in flight; nothing frees a slot
            try:
                sent = [
                    asyncio.ensure_future(post_once(front.base, "/v1/embeddings", body(f"client {i}"), timeout=30))
                    for i in range(256)
                ]

                async def all_dispatched() -> bool:  # each one in flight on the worker, or answered
                    return sum(task.done() for task in sent) + await worker_in_flight(front) == len(sent)

                await until(all_dispatched, poll_s=0.05, what="every request dispatched or refused")
            finally:
                os.kill(worker_pid, signal.SIGCONT)
            return await asyncio.gather(*sent)

        results = asyncio.run(scenario())
        assert len(results) == 256
        codes = [status for status, _, _ in results]
        assert set(codes) <= {200, 429}, set(codes)
        assert codes.count(200) >= 32 and codes.count(429) >= 1
        assert all(headers.get("retry-after") == "1" for status, headers, _ in results if status == 429)
        assert all(json.loads(payload)["model"] == "primary" for status, _, payload in results if status == 200)
        assert front.workers()[0]["in_flight"] == 0


def test_sigterm_drains_in_flight_requests_and_exits_0(encoder_fixture) -> None:  # type: ignore[no-untyped-def]
    fixture = encoder_fixture("embed")
    with running_front(str(fixture), "--platform", "cpu", "--result-cache-entries", "0") as front:
        worker_pid = front.workers()[0]["pid"]

        async def scenario() -> tuple[list[int], int, int]:
            os.kill(worker_pid, signal.SIGSTOP)  # holds the requests in flight until SIGCONT
            try:
                in_flight = [
                    asyncio.ensure_future(post_once(front.base, "/v1/embeddings", body(f"drain {i}"))) for i in range(4)
                ]
                await until(in_flight_is(front, 4), poll_s=0.05, what="4 requests in flight")
                front.proc.send_signal(signal.SIGTERM)
                await until(lambda: draining(front), what="the front draining")
                late, headers, _ = await post_once(front.base, "/v1/embeddings", body("late"))
                assert headers.get("connection") == "close"
                health = (await asyncio.to_thread(httpx.get, f"{front.base}/health", timeout=5)).status_code
                assert front.proc.poll() is None  # still draining
            finally:
                os.kill(worker_pid, signal.SIGCONT)
            return [s for s, _, _ in await asyncio.gather(*in_flight)], late, health

        finished, late, health = asyncio.run(scenario())
        assert finished == [200, 200, 200, 200]
        assert late == 503 and health == 503
        assert front.proc.wait(timeout=30) == 0
        assert not _alive(worker_pid)


def test_a_second_sigterm_exits_at_once(encoder_fixture) -> None:  # type: ignore[no-untyped-def]
    fixture = encoder_fixture("embed")
    with running_front(str(fixture), "--platform", "cpu", "--result-cache-entries", "0") as front:
        worker_pid = front.workers()[0]["pid"]

        async def scenario() -> None:
            os.kill(worker_pid, signal.SIGSTOP)  # the requests never finish by themselves
            pending = [
                asyncio.ensure_future(post_once(front.base, "/v1/embeddings", body(f"slow {i}"))) for i in range(2)
            ]
            await until(in_flight_is(front, 2), poll_s=0.05, what="2 requests in flight")
            front.proc.send_signal(signal.SIGTERM)
            await until(lambda: draining(front), what="the front draining")
            assert front.proc.poll() is None  # draining, waiting for the stuck requests
            started = time.monotonic()
            front.proc.send_signal(signal.SIGTERM)
            await asyncio.to_thread(front.proc.wait, 5)
            assert time.monotonic() - started < 2.0
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

        asyncio.run(scenario())
        assert front.proc.returncode == 1
        deadline = time.monotonic() + 5
        while _alive(worker_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(worker_pid)  # SIGKILL reaches a stopped worker too


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"
