"""The front in-process against fake attached workers: model rewriting, dispatch refusals (429,
503), deadlines (504), dead workers (502), the front result cache, compatibility, outlier
ejection, draining and the reports (R-REP-2…5, R-API-9)."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from tests.fake_worker import FakeWorker
from tests.prometheus_text import metric
from vllm_srun.adapters.config.loader import load_config_data
from vllm_srun.adapters.prometheus import CONTENT_TYPE
from vllm_srun.app.bootstrap import bootstrap_front


def config_for(deployments: dict[str, dict[str, Any]]) -> Any:
    return load_config_data({"global": {"model_catalog": {"deployments": deployments}}})


def attached(*workers: FakeWorker, **fields: Any) -> dict[str, Any]:
    replicas = [{"endpoint": w.endpoint, "model": w.model} for w in workers]
    return {"artifact": "fake-artifact", "replicas": replicas, **fields}


async def until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


class Front:
    """The front of CONFIG built through `bootstrap_front` (KEYWORDS: its keywords and adapters),
    with an in-process client."""

    def __init__(self, config: Any, **keywords: Any) -> None:
        container = bootstrap_front(config, socket_dir="/nonexistent", max_request_bytes=1 << 20, **keywords)
        self.metrics = container.metrics()
        self.fleet = container.fleet()
        self.proxy = container.proxy()
        self.reconfigurer = container.reconfigurer()
        self.app = container.app()
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url="http://front")

    async def __aenter__(self) -> Front:
        await self.fleet.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.aclose()
        await self.fleet.stop(grace_s=1)

    async def ready(self, name: str, count: int) -> None:
        await until(lambda: self.fleet.deployments[name].ready_count() == count)

    async def post(self, body: dict[str, Any], path: str = "/v1/embeddings") -> httpx.Response:
        return await self.client.post(path, json=body, timeout=30)


def scenario(coro: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(coro(), 60))


def test_model_is_rewritten_both_ways_and_any_post_path_is_proxied() -> None:
    async def go() -> None:
        worker = await FakeWorker(model="fake-a").start()
        async with Front(config_for({"primary": attached(worker, result_cache_entries=0)})) as front:
            await front.ready("primary", 1)
            r = await front.post({"model": "primary", "input": "hi"})
            assert r.status_code == 200 and r.json()["model"] == "primary"
            assert worker.received[-1]["model"] == "fake-a"
            assert "total;dur=" in r.headers["server-timing"] and "queue;dur=1.000" in r.headers["server-timing"]
            r = await front.post({"input": "no model"}, path="/v1/systemone/batches")
            assert r.status_code == 200 and r.json()["path"] == "/v1/systemone/batches"
            assert worker.received[-1]["model"] == "fake-a"  # an attached runtime is always told
            assert (await front.post({"model": "fake-artifact", "input": "alias"})).status_code == 200
            r = await front.post({"model": "other", "input": "x"})
            assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
            r = await front.client.post(
                "/v1/embeddings", content=b"{nope", headers={"content-type": "application/json"}
            )
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request"
            assert len(worker.received) == 3  # refusals never reach a worker
        await worker.stop()

    scenario(go)


def test_full_replicas_answer_429_and_no_ready_replica_503() -> None:
    async def go() -> None:
        worker = await FakeWorker().start()
        with socket.socket() as spare:  # a port nobody listens on
            spare.bind(("127.0.0.1", 0))
            dead = f"http://127.0.0.1:{spare.getsockname()[1]}"
        config = config_for(
            {
                "busy": attached(worker),
                "down": {"artifact": "x", "replicas": [{"endpoint": dead, "model": "m"}]},
            }
        )
        async with Front(config) as front:
            await front.ready("busy", 1)
            front.fleet.deployments["busy"].pool.max_in_flight = 1
            slow = asyncio.ensure_future(front.post({"model": "busy", "input": "slow:0.5"}))
            await until(lambda: worker.received != [])
            r = await front.post({"model": "busy", "input": "second"})
            assert r.status_code == 429 and r.headers["retry-after"] == "1"
            assert r.json()["error"]["code"] == "overloaded"
            assert (await slow).status_code == 200
            r = await front.post({"model": "down", "input": "x"})
            assert (
                r.status_code == 503 and r.json()["error"]["code"] == "not_ready" and int(r.headers["retry-after"]) >= 1
            )
            health = await front.client.get("/health")
            assert health.status_code == 503 and health.json()["deployments"]["down"]["ready"] == 0
        await worker.stop()

    scenario(go)


def test_deadlines_answer_504_and_cancel_the_worker_request() -> None:
    async def go() -> None:
        worker = await FakeWorker().start()
        async with Front(config_for({"primary": attached(worker, timeout_ms=200)})) as front:
            await front.ready("primary", 1)
            started = time.monotonic()
            r = await front.post({"input": "slow:5"})
            assert r.status_code == 504 and r.json()["error"]["code"] == "deadline_exceeded"
            assert time.monotonic() - started < 1.0
            r = await front.post({"input": "slow:5", "options": {"deadline_ms": 50}})
            assert r.status_code == 504
            await until(lambda: worker.cancelled == 2)  # the worker saw both connections close
            pool = front.fleet.deployments["primary"].pool
            assert [replica.in_flight for replica in pool] == [0]
            assert (
                front.metrics.outcomes.get({"deployment": "primary", "replica": "primary/0", "outcome": "timeout"}) == 2
            )
        await worker.stop()

    scenario(go)


def test_a_worker_that_drops_the_connection_fails_fast_with_502() -> None:
    async def go() -> None:
        worker = await FakeWorker().start()
        async with Front(config_for({"primary": attached(worker)})) as front:
            await front.ready("primary", 1)
            started = time.monotonic()
            r = await front.post({"input": "die"})
            assert r.status_code == 502 and r.json()["error"]["code"] == "worker_failed"
            assert time.monotonic() - started < 1.0
            r = await front.post({"input": "fail"})
            assert r.status_code == 500
            assert (await front.post({"input": "still fine"})).status_code == 200
        await worker.stop()

    scenario(go)


def test_a_replica_that_cannot_be_connected_to_passes_the_request_on() -> None:
    """A refused connect never reached the replica: the request goes to another replica (each
    tried at most once); the unreachable one counts a failure and backs off; 502 only when no
    replica is left."""

    async def go() -> None:
        worker, lone = await FakeWorker().start(), await FakeWorker().start()
        with socket.socket() as spare:
            spare.bind(("127.0.0.1", 0))
            gone = f"http://127.0.0.1:{spare.getsockname()[1]}"
        config = config_for(
            {
                "primary": {
                    "artifact": "a",
                    "replicas": [
                        {"endpoint": gone, "model": worker.model},
                        {"endpoint": worker.endpoint, "model": worker.model},
                    ],
                    "result_cache_entries": 0,
                },
                "alone": attached(lone),
            }
        )
        async with Front(config) as front:
            await front.ready("primary", 1)
            await front.ready("alone", 1)
            pool = front.fleet.deployments["primary"].pool
            pool["primary/0"].mark_ready()  # as if it had answered before its host went away
            answers = await asyncio.gather(*(front.post({"model": "primary", "input": f"x{i}"}) for i in range(6)))
            assert [r.status_code for r in answers] == [200] * 6
            failed = {"deployment": "primary", "replica": "primary/0", "outcome": "failed"}
            assert front.metrics.outcomes.get(failed) >= 1
            assert pool["primary/0"].state(time.monotonic()).value == "backoff"
            assert [replica.in_flight for replica in pool] == [0, 0]
            # nothing else to try: the refused connect is the answer
            alone = front.fleet.deployments["alone"]
            await lone.stop()  # no longer listening; its pooled connections dropped below
            alone.handles["alone/0"].client.close_idle()
            r = await front.post({"model": "alone", "input": "y"})
            assert r.status_code == 502 and "cannot connect" in r.json()["error"]["message"]
            assert [replica.in_flight for replica in alone.pool] == [0]
        await worker.stop()

    scenario(go)


def test_an_attached_runtime_that_appears_late_goes_from_failed_to_starting_to_ready() -> None:
    """A runtime not listening yet (a pod being scheduled) fails its probes; once it answers
    while loading it is `starting`, not `failed`; ready, it serves."""

    async def go() -> None:
        with socket.socket() as spare:
            spare.bind(("127.0.0.1", 0))
            port = spare.getsockname()[1]
        worker = FakeWorker(port=port, healthy=False)
        async with Front(config_for({"primary": attached(worker)})) as front:
            record = front.fleet.deployments["primary"].pool["primary/0"]
            await until(lambda: record.failed_reason is not None)
            assert "not answering /health" in (record.failed_reason or "")
            await worker.start()  # listening, still loading: 503
            await until(lambda: record.failed_reason is None)
            assert record.state(time.monotonic()).value == "starting"
            worker.healthy = True
            await front.ready("primary", 1)
            assert (await front.post({"input": "late"})).status_code == 200
        await worker.stop()

    scenario(go)


def test_a_single_worker_deployment_caches_answers_in_the_front() -> None:
    async def go() -> None:
        worker = await FakeWorker().start()
        async with Front(config_for({"primary": attached(worker)})) as front:
            await front.ready("primary", 1)
            first = await front.post({"input": "same", "user": "a"})
            second = await front.post({"model": "primary", "input": "same", "user": "b"})
            assert first.json() == second.json() and len(worker.received) == 1
            await front.post({"input": "same", "options": {"return_meta": True}})
            assert len(worker.received) == 2  # meta is per request: never from the cache
            scraped = await front.client.get("/metrics")
            assert scraped.headers["content-type"] == CONTENT_TYPE
            assert metric(scraped.text, "vllm_sr_result_cache_total", deployment="primary", outcome="hit") == 1
        await worker.stop()

    scenario(go)


def test_incompatible_replicas_are_never_dispatched_to() -> None:
    async def go() -> None:
        good = await FakeWorker(name="good").start()
        other = await FakeWorker(name="other", card={"model_sha256": "different"}).start()
        pinned = await FakeWorker(name="pinned").start()
        config = config_for(
            {
                "pool": attached(good, other),
                "strict": attached(pinned, max_num_seqs=64),
            }
        )
        async with Front(config) as front:
            await front.ready("pool", 1)
            pool = front.fleet.deployments["pool"]
            await until(lambda: all(r.state(0).value != "starting" for r in pool.pool))
            states = sorted(r.state(time.monotonic()).value for r in pool.pool)
            assert states == ["incompatible", "ready"]
            for _ in range(6):
                assert (await front.post({"model": "pool", "input": "x"})).json()["worker"] == "good"
            strict = front.fleet.deployments["strict"]
            await until(lambda: next(iter(strict.pool)).incompatible_reason is not None)
            assert "max_num_seqs 8192 but the deployment sets 64" in (next(iter(strict.pool)).incompatible_reason or "")
            inventory = (await front.client.get("/api/v1/inventory")).json()
            rows = {w["id"]: w for d in inventory["deployments"] for w in d["workers"]}
            assert rows["pool/1"]["state"] == "incompatible" and "model_sha256" in rows["pool/1"]["reason"]
        for worker in (good, other, pinned):
            await worker.stop()

    scenario(go)


def test_a_stuck_replica_is_ejected_and_logged(caplog: Any) -> None:
    async def go() -> None:
        healthy = await FakeWorker(name="healthy").start()
        stuck = await FakeWorker(name="stuck").start()
        config = config_for(
            {
                "primary": attached(
                    healthy,
                    stuck,
                    timeout_ms=150,
                    outlier_detection={"consecutive_timeouts": 3, "base_ejection_ms": 60000},
                )
            }
        )
        async with Front(config) as front:
            await front.ready("primary", 2)
            stuck.stall = True
            record = front.fleet.deployments["primary"].pool["primary/1"]

            async def client() -> list[int]:
                codes = []
                while not record.is_ejected(time.monotonic()):
                    codes.append((await front.post({"input": f"x{len(codes)}"})).status_code)
                return codes

            codes = [c for group in await asyncio.gather(*(client() for _ in range(4))) for c in group]
            assert set(codes) <= {200, 504} and 504 in codes and 200 in codes
            assert record.ejections_total == 1
            inventory = (await front.client.get("/api/v1/inventory")).json()
            states = {w["id"]: w["state"] for w in inventory["deployments"][0]["workers"]}
            assert states["primary/1"] == "ejected"
            for _ in range(5):  # ejected: every request goes to the healthy one
                assert (await front.post({"input": "after"})).json()["worker"] == "healthy"
            text = (await front.client.get("/metrics")).text
            assert metric(text, "vllm_sr_ejections_total", deployment="primary", replica="primary/1") == 1
        for worker in (healthy, stuck):
            await worker.stop()

    with caplog.at_level(logging.INFO, logger="vllm_srun.front"):
        scenario(go)
    assert any("replica_ejected deployment=primary replica=primary/1" in m for m in caplog.messages)


def test_draining_refuses_new_requests_and_reports() -> None:
    async def go() -> None:
        worker = await FakeWorker().start()
        async with Front(config_for({"primary": attached(worker)})) as front:
            await front.ready("primary", 1)
            models = (await front.client.get("/v1/models")).json()["data"]
            assert [m["id"] for m in models] == ["primary"] and models[0]["replicas"] == {"desired": 1, "ready": 1}
            assert models[0]["family"] == "encoder"
            assert (await front.client.get("/health")).status_code == 200
            assert (await front.client.get("/health/live")).status_code == 200
            assert (await front.client.get("/openapi.json")).json()["paths"]["/v1/embeddings"]
            assert (await front.client.get("/nowhere")).json()["error"]["code"] == "invalid_request"
            front.proxy.draining = True
            r = await front.post({"input": "late"})
            assert r.status_code == 503 and r.headers["connection"] == "close" and r.headers["retry-after"]
            assert (await front.client.get("/health")).json()["status"] == "draining"
        await worker.stop()

    scenario(go)


def test_a_bundle_goes_to_one_deployment_and_its_models_are_rewritten_both_ways() -> None:
    async def go() -> None:
        worker = await FakeWorker(model="fake-a").start()
        other = await FakeWorker(model="fake-b").start()
        config = config_for(
            {"primary": attached(worker, result_cache_entries=0), "second": attached(other, result_cache_entries=0)}
        )
        async with Front(config) as front:
            await front.ready("primary", 1)
            tasks = [
                {"id": "1", "embeddings": {"input": "x", "model": "primary"}},
                {"id": "2", "classify": {"input": "y"}},
            ]
            r = await front.post({"tasks": tasks}, path="/v1/bundle")
            assert r.status_code == 200, r.text
            sent = worker.received[-1]["tasks"]
            assert [t.get("embeddings", t.get("classify"))["model"] for t in sent] == ["fake-a", "fake-a"]
            got = r.json()["results"]
            assert [x["id"] for x in got] == ["1", "2"]
            assert got[0]["embeddings"]["model"] == "primary" and got[1]["classify"]["model"] == "primary"
            mixed = [tasks[0], {"id": "3", "embeddings": {"input": "z", "model": "second"}}]
            r = await front.post({"tasks": mixed}, path="/v1/bundle")
            assert r.status_code == 400 and "one deployment" in r.json()["error"]["message"]
            assert len(worker.received) == 1 and other.received == []
        await worker.stop()
        await other.stop()

    scenario(go)


def test_the_typesafe_default_name_reaches_the_decision_deployment() -> None:
    async def go() -> None:
        embed = await FakeWorker(name="embed", model="e").start()
        decide = await FakeWorker(name="decide", model="d", card={"surfaces": ["decisions"]}).start()
        config = config_for({"vectors": attached(embed), "judge": attached(decide)})
        async with Front(config) as front:
            await front.ready("vectors", 1)
            await front.ready("judge", 1)
            r = await front.post({"model": "jev-latest", "input": "x"}, path="/v1/systemone")
            assert r.status_code == 200 and r.json()["worker"] == "decide" and decide.received[-1]["model"] == "d"
            listed = (await front.client.get("/v1/models")).json()
            assert [m["name"] for m in listed["models"]] == ["vectors", "judge", "jev-latest"]
            assert [c["id"] for c in listed["data"]] == ["vectors", "judge"]
        await embed.stop()
        await decide.stop()

    scenario(go)


def test_a_runtime_attached_on_a_unix_socket_under_its_public_name(tmp_path: Any) -> None:
    """Upstream's `endpoint: unix:///…` and `public_name`: the front reaches the runtime over its
    socket, takes the public name in `model` beside the deployment's, and answers with it."""

    async def go() -> None:
        worker = await FakeWorker(model="fake-a", uds=str(tmp_path / "runtime.sock")).start()
        deployment = {"endpoint": worker.endpoint, "served_name": worker.model, "public_name": "acme/fake-a"}
        async with Front(config_for({"primary": {**deployment, "result_cache_entries": 0}})) as front:
            await front.ready("primary", 1)
            for named in ("acme/fake-a", "primary"):
                r = await front.post({"model": named, "input": "hi"})
                assert r.status_code == 200 and r.json()["model"] == "acme/fake-a", r.text
                assert worker.received[-1]["model"] == "fake-a"
        await worker.stop()

    scenario(go)


def test_a_replica_serving_another_profile_than_the_deployment_asks_is_incompatible() -> None:
    async def go() -> None:
        right = await FakeWorker(model="m", card={"profile": "batching"}).start()
        wrong = await FakeWorker(model="m", card={"profile": "exact"}).start()
        config = config_for({"primary": attached(right, wrong, profile="batching", result_cache_entries=0)})
        async with Front(config) as front:
            await front.ready("primary", 1)
            await until(lambda: any(r.incompatible_reason for r in front.fleet.deployments["primary"].pool))
            reasons = [r.incompatible_reason for r in front.fleet.deployments["primary"].pool if r.incompatible_reason]
            assert reasons == ["serves profile exact but the deployment asks for batching"]
            for _ in range(4):
                assert (await front.post({"input": "x"})).status_code == 200
            assert len(wrong.received) == 0  # never dispatched to
        await right.stop()
        await wrong.stop()

    scenario(go)
