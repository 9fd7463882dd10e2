"""Live reconfiguration in-process (R-REP-2) against fake attached workers: unchanged workers keep
their identity, new ones are published only once ready and compatible, retired ones finish
what they hold, and a refused or failing reload changes nothing."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.fake_worker import FakeWorker
from tests.integration.test_front_proxy import Front, attached, config_for, scenario, until
from vllm_srun.adapters.config.schema import ConfigError


class ReloadableFront(Front):
    """A front whose reload reads the config a test hands `reload` (or raises the error it hands)."""

    def __init__(self, config: Any) -> None:
        self.next: Any = config
        super().__init__(config, load_config=self.load, reload_ready_timeout_s=10)

    def load(self) -> Any:
        if isinstance(self.next, Exception):
            raise self.next
        return self.next

    async def reload(self, config: Any) -> Any:
        self.next = config
        return await self.reconfigurer.reload()


def workers_of(front: Front, name: str = "primary") -> list[str]:
    return list(front.fleet.deployments[name].handles)


def test_add_then_remove_a_replica_keeps_the_unchanged_one() -> None:
    async def go() -> None:
        w1, w2 = await FakeWorker(name="w1").start(), await FakeWorker(name="w2").start()
        async with ReloadableFront(config_for({"primary": attached(w1)})) as front:
            await front.ready("primary", 1)
            first = front.fleet.deployments["primary"].handles["primary/0"]
            status = await front.reload(config_for({"primary": attached(w1, w2)}))
            assert status.state == "done" and status.kept == ["primary/0"] and status.started == ["primary/1"]
            assert workers_of(front) == ["primary/0", "primary/1"]
            assert front.fleet.deployments["primary"].handles["primary/0"] is first  # no restart
            assert front.fleet.deployments["primary"].ready_count() == 2  # published only once ready
            seen = {(await front.post({"input": f"x{i}"})).json()["worker"] for i in range(6)}
            assert seen == {"w1", "w2"}
            status = await front.reload(config_for({"primary": attached(w2)}))
            assert status.kept == ["primary/1"] and status.retired == ["primary/0"] and status.started == []
            assert workers_of(front) == ["primary/1"]
            inventory = (await front.client.get("/api/v1/inventory")).json()
            assert [w["id"] for w in inventory["deployments"][0]["workers"]] == ["primary/1"]
        await w1.stop()
        await w2.stop()

    scenario(go)


def test_a_retired_worker_finishes_what_it_holds() -> None:
    async def go() -> None:
        w1, w2 = await FakeWorker(name="w1").start(), await FakeWorker(name="w2").start()
        async with ReloadableFront(config_for({"primary": attached(w1)})) as front:
            await front.ready("primary", 1)
            slow = asyncio.ensure_future(front.post({"input": "slow:1.0"}))
            await until(lambda: w1.received != [])
            status = await front.reload(config_for({"primary": attached(w2)}))
            assert status.state == "done" and status.retired == ["primary/0"]
            assert (await front.post({"input": "after"})).json()["worker"] == "w2"  # new requests: the new pool
            assert "primary/0" in front.fleet.retiring  # still holding the slow request
            metrics = (await front.client.get("/metrics")).text
            assert 'vllm_sr_replica_in_flight{deployment="primary",replica="primary/0"} 1.0' in metrics
            answer = await slow
            assert answer.status_code == 200 and answer.json()["worker"] == "w1" and w1.cancelled == 0
            await until(lambda: not front.fleet.retiring)
            metrics = (await front.client.get("/metrics")).text  # a retired replica's gauges are gone
            assert 'replica="primary/0"' not in metrics.split("vllm_sr_replica_in_flight", 1)[1].split("# HELP", 1)[0]
        await w1.stop()
        await w2.stop()

    scenario(go)


def test_a_refused_or_failed_reload_changes_nothing() -> None:
    async def go() -> None:
        w1 = await FakeWorker(name="w1").start()
        odd = await FakeWorker(name="odd", card={"model_sha256": "other"}).start()
        async with ReloadableFront(config_for({"primary": attached(w1)})) as front:
            await front.ready("primary", 1)
            status = await front.reload(ConfigError(["deployments.primary.max_num_seqs: expected >= 1, got 0"]))
            assert status.state == "refused" and status.problems == [
                "deployments.primary.max_num_seqs: expected >= 1, got 0"
            ]
            status = await front.reload(config_for({"primary": attached(w1, odd)}))
            assert (
                status.state == "failed"
                and "incompatible" in status.problems[0]
                and "model_sha256" in status.problems[0]
            )
            assert workers_of(front) == ["primary/0"] and front.fleet.preparing == []
            assert (await front.post({"input": "still"})).status_code == 200
            same = await front.reload(config_for({"primary": attached(w1)}))
            assert same.state == "done" and same.kept == ["primary/0"] and same.started == same.retired == []
        await w1.stop()
        await odd.stop()

    scenario(go)


def test_deployments_come_and_go_and_an_unchanged_one_stays_the_same_object() -> None:
    async def go() -> None:
        w1, w2 = await FakeWorker(name="w1").start(), await FakeWorker(name="w2", model="m2").start()
        async with ReloadableFront(config_for({"primary": attached(w1)})) as front:
            await front.ready("primary", 1)
            primary = front.fleet.deployments["primary"]
            both = config_for({"primary": attached(w1), "second": attached(w2)})
            status = await front.reload(both)
            assert status.state == "done" and status.started == ["second/0"]
            assert front.fleet.deployments["primary"] is primary
            assert (await front.post({"model": "second", "input": "x"})).json()["worker"] == "w2"
            status = await front.reload(config_for({"second": attached(w2)}))
            assert status.retired == ["primary/0"] and list(front.fleet.deployments) == ["second"]
            r = await front.post({"model": "primary", "input": "x"})
            assert r.status_code == 404
        await w1.stop()
        await w2.stop()

    scenario(go)


def test_a_kept_single_worker_keeps_the_front_cache_and_a_new_one_starts_empty() -> None:
    async def go() -> None:
        w1, w2 = await FakeWorker(name="w1").start(), await FakeWorker(name="w2").start()
        async with ReloadableFront(config_for({"primary": attached(w1)})) as front:
            await front.ready("primary", 1)
            assert (await front.post({"input": "cached"})).status_code == 200
            cache = front.fleet.deployments["primary"].cache
            assert cache is not None and len(cache) == 1
            status = await front.reload(config_for({"primary": attached(w1, timeout_ms=5000)}))
            assert status.kept == ["primary/0"] and front.fleet.deployments["primary"].cache is cache
            status = await front.reload(config_for({"primary": attached(w2, timeout_ms=5000)}))
            assert status.started == ["primary/1"]
            fresh = front.fleet.deployments["primary"].cache
            assert fresh is not None and fresh is not cache and len(fresh) == 0
        await w1.stop()
        await w2.stop()

    scenario(go)
