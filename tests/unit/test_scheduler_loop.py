"""The runner drives the scheduler on the event loop and forwards on the device thread."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from tests.fakes import FakeForward
from tests.waiting import until
from vllm_srun.adapters.call import Call
from vllm_srun.adapters.serving.device_thread import DeviceThread
from vllm_srun.adapters.serving.scheduler_loop import SchedulerLoop
from vllm_srun.domain.errors import ForwardFailed
from vllm_srun.domain.scheduling.answers import EXPIRED
from vllm_srun.domain.scheduling.costs import CostModel
from vllm_srun.domain.scheduling.lanes import Accounting, Lane
from vllm_srun.domain.scheduling.planning import Budget
from vllm_srun.domain.scheduling.rows import RowSpec
from vllm_srun.domain.scheduling.scheduler import Scheduler


def make(engine, *, window_ms: float = 2.0, seqs: int = 64, invariant: bool = False):  # type: ignore[no-untyped-def]
    scheduler = Scheduler([Lane("text")], Budget(seqs, 4096), window_s=window_ms / 1000, batch_invariant=invariant)
    device = DeviceThread()
    return SchedulerLoop(scheduler, lambda batch, payloads: engine(batch.lane, payloads), device), device


def test_concurrent_requests_merge_and_answer_in_order() -> None:
    engine = FakeForward()
    seen_threads: set[int] = set()

    def run(lane, payloads):  # type: ignore[no-untyped-def]
        seen_threads.add(threading.get_ident())
        time.sleep(0.005)
        return engine.run(lane, payloads)

    async def main() -> list:
        runner, device = make(run)
        runner.start()
        outs = await asyncio.gather(*(runner.submit([RowSpec(5 + i, (i, j)) for j in range(3)]) for i in range(20)))
        await runner.stop()
        device.shutdown()
        return outs

    outs = asyncio.run(main())
    assert [o.outputs for o in outs] == [tuple((i, j) for j in range(3)) for i in range(20)]
    assert len(engine.forwards) < 20
    assert threading.get_ident() not in seen_threads  # forwards never run on the loop's thread
    assert all(o.forwards >= 1 and o.padded_tokens >= 8 for o in outs)


def test_failed_forward_fails_only_its_requests() -> None:
    calls = {"n": 0}

    def run(lane, payloads):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if any(p == "poison" for p in payloads):
            raise RuntimeError("boom")
        return list(payloads)

    async def main() -> tuple:
        runner, device = make(run, window_ms=0, seqs=1)
        runner.start()
        results = await asyncio.gather(
            runner.submit([RowSpec(3, "ok-1")]),
            runner.submit([RowSpec(3, "poison")]),
            runner.submit([RowSpec(3, "ok-2")]),
            return_exceptions=True,
        )
        await runner.stop()
        device.shutdown()
        return results

    a, b, c = asyncio.run(main())
    assert a.outputs == ("ok-1",) and c.outputs == ("ok-2",)
    assert isinstance(b, ForwardFailed)


def test_cancelled_request_never_reaches_the_device() -> None:
    engine = FakeForward()
    gate, on_device = threading.Event(), threading.Event()

    def run(lane, payloads):  # type: ignore[no-untyped-def]
        on_device.set()
        gate.wait(5)
        return engine.run(lane, payloads)

    async def main() -> None:
        runner, device = make(run, window_ms=0, seqs=1)
        runner.start()
        first = asyncio.ensure_future(runner.submit([RowSpec(3, "first")]))
        await until(on_device.is_set, what="first on the device, blocked on the gate")
        doomed = asyncio.ensure_future(runner.submit([RowSpec(3, "doomed")]))
        await until(lambda: runner.scheduler.pending_requests == 2, what="doomed queued behind first")
        doomed.cancel()
        with pytest.raises(asyncio.CancelledError):
            await doomed
        gate.set()
        assert (await first).outputs == ("first",)
        assert (await runner.submit([RowSpec(3, "after")])).outputs == ("after",)
        await runner.stop()
        device.shutdown()

    asyncio.run(main())
    ran = [p for _, payloads in engine.forwards for p in payloads]
    assert ran == ["first", "after"]


def test_rows_past_their_deadline_are_not_run_and_answer_expired_at_the_deadline() -> None:
    """R-API-10: a row not started by its deadline never reaches the device and answers EXPIRED;
    the request is answered at its deadline when none of its rows runs, else when the running
    ones end; rows with no deadline (or a later one) are run as usual."""
    engine = FakeForward()
    gate, on_device = threading.Event(), threading.Event()

    def run(lane, payloads):  # type: ignore[no-untyped-def]
        on_device.set()
        gate.wait(5)
        return engine.run(lane, payloads)

    async def main() -> None:
        runner, device = make(run, window_ms=0, seqs=1)
        runner.start()
        # its first row runs (held at the gate), its second waits behind it and expires
        held = asyncio.ensure_future(runner.submit([RowSpec(3, "held"), RowSpec(3, "late")], deadlines=[0.05, 0.05]))
        await until(on_device.is_set, what="the first row on the device")
        waiting = asyncio.ensure_future(
            runner.submit([RowSpec(3, "soon"), RowSpec(3, "kept")], deadlines=[0.05, None])  # one row without
        )
        lone = time.perf_counter()
        gone = await runner.submit([RowSpec(3, "gone")], deadlines=[0.05])  # all queued: answered at its deadline
        assert gone.outputs == (EXPIRED,) and time.perf_counter() - lone < 2
        assert not held.done()  # its running row is not over yet
        gate.set()
        assert (await held).outputs == ("held", EXPIRED)
        assert (await waiting).outputs == (EXPIRED, "kept")
        await runner.stop()
        device.shutdown()

    asyncio.run(main())
    ran = [p for _, payloads in engine.forwards for p in payloads]
    assert ran == ["held", "kept"]


def _lone_request_seconds(*, window_ms: float, invariant: bool = False) -> float:
    async def main() -> float:
        runner, device = make(FakeForward().run, window_ms=window_ms, invariant=invariant)
        runner.start()
        t0 = time.perf_counter()
        await runner.submit([RowSpec(3, "x")])
        elapsed = time.perf_counter() - t0
        await runner.stop()
        device.shutdown()
        return elapsed

    return asyncio.run(main())


def test_lone_request_pays_the_window_and_no_more() -> None:
    elapsed = _lone_request_seconds(window_ms=20)
    assert 0.019 <= elapsed < 0.5


def test_batch_invariant_model_skips_the_window() -> None:
    assert _lone_request_seconds(window_ms=500, invariant=True) < 0.4


def test_concurrent_forwards_run_side_by_side_on_the_device_threads() -> None:
    """Two slots, two device threads: the second forward starts while the first runs (both wait on
    a barrier that only two forwards running at once can pass), and every answer is right."""
    engine = FakeForward()
    barrier = threading.Barrier(2, timeout=10)
    lock = threading.Lock()
    started: list[int] = []
    declared: list[int] = []

    def run(lane, payloads):  # type: ignore[no-untyped-def]
        with lock:
            started.append(len(started))
            meet = len(started) <= 2
        if meet:  # the first two forwards: BrokenBarrierError unless both run at once
            barrier.wait()
        with lock:
            return engine.run(lane, payloads)

    async def main() -> list:
        scheduler = Scheduler([Lane("text")], Budget(2, 4096), window_s=0.0, max_in_flight=2)
        device = DeviceThread(workers=2, initializer=lambda: declared.append(threading.get_ident()))
        loop = SchedulerLoop(scheduler, lambda batch, payloads: run(batch.lane, payloads), device)
        loop.start()
        outs = await asyncio.gather(*(loop.submit([RowSpec(5, (i, j)) for j in range(2)]) for i in range(6)))
        await loop.stop()
        device.shutdown()
        return outs

    outs = asyncio.run(main())
    assert [o.outputs for o in outs] == [((i, 0), (i, 1)) for i in range(6)]
    assert len(started) == 6 and not barrier.broken
    assert len(set(declared)) == 2  # the initializer ran once on each device thread


def test_one_slot_runs_one_forward_at_a_time_even_with_two_device_threads() -> None:
    running, most = [0], [0]
    lock = threading.Lock()

    def run(lane, payloads):  # type: ignore[no-untyped-def]
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.003)
        with lock:
            running[0] -= 1
        return list(payloads)

    async def main() -> None:
        scheduler = Scheduler([Lane("text")], Budget(1, 4096), window_s=0.0)
        device = DeviceThread(workers=2)
        loop = SchedulerLoop(scheduler, lambda batch, payloads: run(batch.lane, payloads), device)
        loop.start()
        await asyncio.gather(*(loop.submit([RowSpec(5, i)]) for i in range(10)))
        await loop.stop()
        device.shutdown()

    asyncio.run(main())
    assert most[0] == 1


def test_the_lightest_tenant_is_answered_on_the_express_thread_while_both_slots_are_held() -> None:
    """R-FAIR-7: a flood of tenant a holds both slots (its forwards wait on a gate); a request of
    tenant b is answered meanwhile, by a forward on the express device thread, and once the gate
    opens every request of a is answered too. Without an express thread b waits for a slot."""
    gate = threading.Event()
    threads: dict[str, set[str]] = {"a": set(), "b": set()}

    def run(batch, payloads):  # type: ignore[no-untyped-def]
        for row in batch.rows:
            threads[row.tenant].add(threading.current_thread().name)
        if any(r.tenant == "a" for r in batch.rows) and not any(r.tenant == "b" for r in batch.rows):
            assert gate.wait(10), "the test never opened the gate"
        return list(payloads)

    async def main(express: bool) -> tuple[bool, list]:
        gate.clear()
        scheduler = Scheduler([Lane("text")], Budget(4, 4096), window_s=0.0, max_in_flight=2)
        device = DeviceThread("slot", workers=2)
        fast = DeviceThread("express") if express else None
        loop = SchedulerLoop(scheduler, run, device, express=fast)
        loop.start()
        flood = [asyncio.create_task(loop.submit([RowSpec(5, ("a", i))], Call(tenant="a"))) for i in range(12)]
        for _ in range(10_000):  # until both slots are taken by a's forwards
            if scheduler.in_flight == 2:
                break
            await asyncio.sleep(0.001)
        light = asyncio.create_task(loop.submit([RowSpec(5, ("b", 0))], Call(tenant="b")))
        done, _ = await asyncio.wait({light}, timeout=2)
        answered_while_held = bool(done)
        gate.set()
        outs = await asyncio.gather(*flood, light)
        await loop.stop()
        device.shutdown()
        if fast is not None:
            fast.shutdown()
        return answered_while_held, [o.outputs for o in outs]

    held, outs = asyncio.run(main(express=True))
    assert held and outs == [*((("a", i),) for i in range(12)), (("b", 0),)]
    assert all(name.startswith("express") for name in threads["b"]) and threads["b"]
    assert all(name.startswith("slot") for name in threads["a"] - threads["b"])
    threads["b"].clear()
    held, outs = asyncio.run(main(express=False))
    assert not held and outs[-1] == (("b", 0),)  # it waited for a slot


def text_and_image_scheduler() -> Scheduler:
    """Two slots, a `text` lane and a `media` lane costlier per token (R-BAT-6)."""
    costs = CostModel()
    costs.seed("text", 1e-6)
    costs.seed("media", 1e-4)
    return Scheduler(
        [Lane("text", Accounting.PACKED), Lane("media", Accounting.PACKED)],
        Budget(4, 64),
        window_s=0.0,
        costs=costs,
        max_in_flight=2,
    )


def test_a_text_row_is_answered_on_the_express_thread_while_image_forwards_hold_both_slots() -> None:
    """R-BAT-6's lane express: image forwards hold both slots (they wait on a gate); a text
    request is answered meanwhile, on the express device thread, with the answer it gets alone;
    once the gate opens every image request is answered too. Without an express thread the text
    request waits for a slot."""
    gate = threading.Event()
    threads: dict[str, set[str]] = {"text": set(), "media": set()}

    def run(batch, payloads):  # type: ignore[no-untyped-def]
        threads[batch.lane].add(threading.current_thread().name)
        if batch.lane == "media":
            assert gate.wait(10), "the test never opened the gate"
        return [("answer", p) for p in payloads]

    async def main(express: bool) -> tuple[bool, list]:
        gate.clear()
        scheduler = text_and_image_scheduler()
        device = DeviceThread("slot", workers=2)
        fast = DeviceThread("express") if express else None
        loop = SchedulerLoop(scheduler, run, device, express=fast)
        loop.start()
        images = [asyncio.create_task(loop.submit([RowSpec(64, ("m", i), "media")])) for i in range(6)]
        for _ in range(10_000):  # until both slots hold image forwards
            if scheduler.in_flight == 2:
                break
            await asyncio.sleep(0.001)
        text = asyncio.create_task(
            loop.submit([RowSpec(8, ("t", 0), "text"), RowSpec(8, ("t", 1), "text")], exact=True)
        )
        done, _ = await asyncio.wait({text}, timeout=2)
        answered_while_held = bool(done)
        gate.set()
        outs = await asyncio.gather(*images, text)
        await loop.stop()
        device.shutdown()
        if fast is not None:
            fast.shutdown()
        return answered_while_held, [o.outputs for o in outs]

    held, outs = asyncio.run(main(express=True))
    alone = [("answer", ("t", 0)), ("answer", ("t", 1))]
    assert held and outs[-1] == tuple(alone)
    assert outs[:-1] == [(("answer", ("m", i)),) for i in range(6)]
    assert threads["text"] and all(name.startswith("express") for name in threads["text"])
    assert all(name.startswith("slot") for name in threads["media"])
    threads["text"].clear()
    held, outs = asyncio.run(main(express=False))
    assert not held and outs[-1] == tuple(alone)  # it waited for a slot
    assert all(name.startswith("slot") for name in threads["text"])


def test_an_exact_requests_text_rows_run_side_by_side_on_the_express_threads() -> None:
    """R-BAT-6: the two questions of an exact request on a model that is not batch-invariant are two
    forwards; while image forwards hold both slots they run at once on two express threads (one per
    slot), as they would on the two slots, not one after the other: each text forward waits at a
    barrier for the other, which only two threads at once can pass."""
    gate, met = threading.Event(), threading.Barrier(2, timeout=5)

    def run(batch, payloads):  # type: ignore[no-untyped-def]
        if batch.lane == "media":
            assert gate.wait(10), "the test never opened the gate"
        else:
            met.wait()
        return [("answer", p) for p in payloads]

    async def main() -> tuple[bool, tuple]:
        scheduler = text_and_image_scheduler()
        device, fast = DeviceThread("slot", workers=2), DeviceThread("express", workers=2)
        loop = SchedulerLoop(scheduler, run, device, express=fast)
        loop.start()
        images = [asyncio.create_task(loop.submit([RowSpec(64, ("m", i), "media")])) for i in range(4)]
        for _ in range(10_000):
            if scheduler.in_flight == 2:
                break
            await asyncio.sleep(0.001)
        text = asyncio.create_task(
            loop.submit([RowSpec(8, ("t", 0), "text"), RowSpec(8, ("t", 1), "text")], exact=True)
        )
        done, _ = await asyncio.wait({text}, timeout=4)
        gate.set()
        outs = await asyncio.gather(*images, text)
        await loop.stop()
        device.shutdown()
        fast.shutdown()
        return bool(done), outs[-1].outputs

    held, outputs = asyncio.run(main())
    assert held and outputs == (("answer", ("t", 0)), ("answer", ("t", 1)))


def test_slot_forwards_of_the_costlier_lane_pause_at_their_yield_points_while_a_lane_express_runs() -> None:
    """R-BAT-6 with yield points (`adapters/lane_yield.py`): image forwards hold both slots; a text
    row runs on the express thread; an image forward that reaches a yield point meanwhile waits
    there until the text forward has ended, then goes on; every answer is the one it gets alone.
    Without a gate the image forwards pass their points at once."""
    from vllm_srun.adapters.lane_yield import YieldGate, yield_point

    def main(gate: YieldGate | None) -> tuple[list[str], list]:
        at_point, text_end = threading.Event(), threading.Event()
        events: list[str] = []

        def run(batch, payloads):  # type: ignore[no-untyped-def]
            if batch.lane == "media":
                assert at_point.wait(10), "the test never let the image forwards reach their point"
                yield_point()
                events.append("image passed")
            else:
                events.append("text started")
                assert text_end.wait(10), "the test never ended the text forward"
                events.append("text ended")
            return [("answer", p) for p in payloads]

        async def drive() -> list:
            scheduler = text_and_image_scheduler()
            device, fast = DeviceThread("slot", workers=2), DeviceThread("express", workers=2)
            loop = SchedulerLoop(scheduler, run, device, express=fast, yield_gate=gate)
            loop.start()
            images = [asyncio.create_task(loop.submit([RowSpec(64, ("m", i), "media")])) for i in range(2)]
            await until(lambda: scheduler.in_flight == 2, what="both slots hold image forwards")
            text = asyncio.create_task(loop.submit([RowSpec(8, ("t", 0), "text")]))
            await until(lambda: "text started" in events, what="the text forward on the express thread")
            at_point.set()
            if gate is not None:  # both image forwards wait at their point before the text one ends
                await until(lambda: gate.pauses == 2, what="the image forwards at their yield points")
            else:
                await until(lambda: events.count("image passed") == 2, what="the image forwards past their points")
            text_end.set()
            outs = await asyncio.gather(*images, text)
            await loop.stop()
            device.shutdown()
            fast.shutdown()
            return [o.outputs for o in outs]

        return events, asyncio.run(drive())

    gate = YieldGate(cap_s=10.0)
    events, outs = main(gate)
    assert events == ["text started", "text ended", "image passed", "image passed"]
    assert outs == [(("answer", ("m", 0)),), (("answer", ("m", 1)),), (("answer", ("t", 0)),)]
    assert gate.pauses == 2 and not gate.held
    events, outs = main(None)
    assert events[:3] == ["text started", "image passed", "image passed"]
