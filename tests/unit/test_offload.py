"""Request preparation off the event loop (`adapters/offload.py`): small work stays on the loop,
large work runs on the bounded pool (the loop keeps answering meanwhile), a backed-up pool
answers 429, and the request's context goes with the work."""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import threading
import time

import pytest

from tests.waiting import until
from vllm_srun.adapters.offload import INLINE_BYTES, Offload
from vllm_srun.domain.errors import Overloaded
from vllm_srun.domain.worker.threads import preparation_threads

TAG: contextvars.ContextVar[str] = contextvars.ContextVar("tag", default="-")


def test_small_work_runs_inline_and_large_work_on_the_pool() -> None:
    async def scenario() -> tuple[str, str]:
        offload = Offload(1)
        try:
            small = await offload.hand_off(lambda: threading.current_thread().name, size=10)
            large = await offload.hand_off(lambda: threading.current_thread().name, size=INLINE_BYTES)
            return small, large
        finally:
            offload.shutdown()

    small, large = asyncio.run(scenario())
    assert small == "MainThread" and large.startswith("srun-prepare")


def test_the_loop_keeps_answering_while_large_work_runs() -> None:
    async def scenario() -> float:
        offload = Offload(1)
        ticks: list[float] = []

        async def ticker() -> None:
            while True:
                ticks.append(time.perf_counter())
                await asyncio.sleep(0.01)

        running = asyncio.ensure_future(ticker())
        try:
            await offload.hand_off(time.sleep, 0.5, size=1 << 20)
        finally:
            running.cancel()
            offload.shutdown()
        return max(b - a for a, b in itertools.pairwise(ticks))

    assert asyncio.run(scenario()) < 0.2


def test_a_backed_up_pool_answers_overloaded_and_context_follows_the_work() -> None:
    async def scenario() -> str:
        offload = Offload(1, max_waiting=2)
        gate = threading.Event()
        try:
            blocking = [asyncio.ensure_future(offload.hand_off(gate.wait, 10, size=1 << 20)) for _ in range(2)]
            await until(lambda: offload.waiting == 2, what="two large jobs running or waiting")
            with pytest.raises(Overloaded):
                await offload.hand_off(time.sleep, 0, size=1 << 20)
            gate.set()
            await asyncio.gather(*blocking)
            TAG.set("request-7")
            return await offload.hand_off(TAG.get, size=1 << 20)
        finally:
            gate.set()
            offload.shutdown()

    assert asyncio.run(scenario()) == "request-7"


@pytest.mark.parametrize(("forward", "prepare"), [(1, 1), (3, 1), (8, 2), (15, 3), (64, 4)])
def test_the_pool_is_a_small_share_of_the_forward_threads(forward: int, prepare: int) -> None:
    assert preparation_threads(forward) == prepare
