"""Issue 9, class 1: CPU work on the event loop. A large request (decoding ~6 MB, tokenizing
2,048 inputs of 1,500 words, truncating) used to stall a worker for seconds, `/health/live`
included, and a dozen of them made a front's replicas look failed. Preparation now runs on a
bounded pool off the loop: the worker keeps answering and the replicas stay ready."""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.hostile.clients import LivenessProbe, Server, inventory, post

pytestmark = pytest.mark.slow


def large_request(model: str, inputs: int = 2048, words: int = 1500, seed: int = 0) -> dict[str, object]:
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    texts = [" ".join(rng.choice(letters) for _ in range(words)) for _ in range(inputs)]
    return {"model": model, "input": texts, "options": {"overflow": "truncate"}}


class SmallClient:
    """A normal client alongside the attack: one small request every 200 ms, latencies kept."""

    def __init__(self, server: Server, model: str) -> None:
        self.server, self.model = server, model
        self.results: list[tuple[int, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.server.base, timeout=30) as client:
            i = 0
            while not self._stop.is_set():
                start = time.perf_counter()
                status = client.post("/v1/embeddings", json={"model": self.model, "input": f"normal {i}"}).status_code
                self.results.append((status, time.perf_counter() - start))
                i += 1
                self._stop.wait(0.2)

    def __enter__(self) -> SmallClient:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


def test_a_large_request_never_stalls_the_worker(worker: Server) -> None:
    body = large_request("tiny-embed")
    with LivenessProbe(worker) as probe, SmallClient(worker, "tiny-embed") as normal:
        answer = post(worker, "/v1/embeddings", body, timeout=120)
    assert answer.status_code == 200, answer.text[:300]
    assert len(answer.json()["data"]) == 2048
    assert probe.failures == [] and len(probe.latencies) > 20
    assert probe.worst() < 1.0, f"/health/live took {probe.worst():.2f} s"  # was 8-13 s
    assert {status for status, _ in normal.results} == {200}
    assert max(seconds for _, seconds in normal.results) < 2.0


def test_a_dozen_large_requests_leave_every_replica_ready(front: Server) -> None:
    bodies = [large_request("embed", inputs=512, seed=n) for n in range(12)]
    states: list[set[str]] = []
    healths: list[int] = []
    with LivenessProbe(front) as probe, SmallClient(front, "embed") as normal, ThreadPoolExecutor(12) as pool:
        running = [pool.submit(post, front, "/v1/embeddings", body, 180) for body in bodies]
        while not all(r.done() for r in running):
            states.append({w["state"] for d in inventory(front)["deployments"] for w in d["workers"]})
            healths.append(httpx.get(front.base + "/health", timeout=10).status_code)
            time.sleep(0.5)
        answers = [r.result() for r in running]
    assert [a.status_code for a in answers] == [200] * 12
    assert states and all(s == {"ready"} for s in states), states  # no replica looked failed
    assert set(healths) == {200}  # the deployment never answered 503
    assert {status for status, _ in normal.results} == {200}
    assert probe.failures == [] and probe.worst() < 1.0
