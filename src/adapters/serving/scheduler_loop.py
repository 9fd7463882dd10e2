"""Drives one model's scheduler on the event loop and its forwards on the device thread.

`submit(rows, call)` returns the rows' outputs in order once the request's last row ran. A forward is
`run_batch(batch, payloads)` on the device thread (the batch says its lane and counted tokens);
as many run at once as the scheduler has slots (`Scheduler.max_in_flight`, the device's
concurrent forwards), each as its own task, and the driver plans again as soon as one ends. A caller
that goes away (cancellation, deadline) cancels its request: its rows that have not reached
the device never will. With EXPRESS device threads, while every slot is busy the scheduler's
express forwards (`Scheduler.next_express`: a cheaper lane's rows while the slots run a costlier
lane's, R-BAT-6, up to one per slot; else the lightest tenant's next turn, R-FAIR-7) run there,
beside them. Every forward has a batch id, unique in the process; a traced request (its `Call`'s
timing holds a `forwards` list) gets a `ForwardRecord` of each forward its rows ran in.

Row deadlines (R-API-10): `submit(deadlines=[...])` gives each row the seconds it may wait; at its
deadline a row that has not reached the device never will (`Scheduler.expire`): its output is
`EXPIRED`, and the request is answered as soon as none of its rows is still to run.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from vllm_srun.adapters.call import Call
from vllm_srun.adapters.clock import MonotonicClock
from vllm_srun.adapters.lane_yield import YieldGate, yielding
from vllm_srun.adapters.request_timing import ForwardRecord
from vllm_srun.adapters.serving.device_thread import DeviceThread
from vllm_srun.domain.errors import ForwardFailed
from vllm_srun.domain.ports import Clock
from vllm_srun.domain.scheduling.planning import ForwardBatch
from vllm_srun.domain.scheduling.rows import RowSpec
from vllm_srun.domain.scheduling.scheduler import Scheduler

log = logging.getLogger("vllm_srun.scheduler_loop")
_BATCH_IDS = itertools.count(1)  # every forward of the process, whatever its model
UNTRACED = Call()  # rows of no request in particular (tests, calibration): the default tenant, untraced


@dataclass(slots=True)
class ForwardStats:
    outputs: tuple[Any, ...]
    queue_s: float
    forward_s: float
    forwards: int
    padded_tokens: int


@dataclass(slots=True)
class _Waiter:
    future: asyncio.Future
    arrival: float
    first_forward: float | None = None
    forward_s: float = 0.0
    forwards: int = 0
    padded_tokens: int = 0
    trace: list[ForwardRecord] | None = None  # the request is traced: its forwards go here


ForwardObserver = Callable[[ForwardBatch, float, bool], None]


class SchedulerLoop:
    def __init__(
        self,
        scheduler: Scheduler,
        run_batch: Callable[[ForwardBatch, list[Any]], Sequence[Any]],
        device: DeviceThread,
        *,
        clock: Clock | None = None,
        on_forward: ForwardObserver | None = None,
        express: DeviceThread | None = None,
        yield_gate: YieldGate | None = None,
    ) -> None:
        self.scheduler = scheduler
        self._run_batch = run_batch
        self._device = device
        self._express = express
        self._gate = yield_gate  # held while lane express forwards run; slot forwards yield to it
        self._clock = clock or MonotonicClock()
        self._on_forward = on_forward
        self._waiters: dict[int, _Waiter] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._running: set[asyncio.Task] = set()
        self._traced = 0  # waiting requests that are traced
        self.forwards = 0

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._drive(), name="srun-scheduler")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._running) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
        self._task = None
        self._running.clear()

    async def submit(
        self,
        rows: Sequence[RowSpec],
        call: Call = UNTRACED,
        *,
        exact: bool = False,
        deadlines: Sequence[float | None] | None = None,
    ) -> ForwardStats:
        """CALL's rows' outputs; its tenant and priority decide when they run (R-FAIR-2/3), never
        what they answer. A traced call (its timing's `forwards` a list) gets a record of each forward its
        rows run in. EXACT: the request's profile does not coalesce (R-PROF-2, `Scheduler.submit`).
        DEADLINES (one per row, seconds from now; None: none): a row not started by its deadline
        is not run, its output is `EXPIRED` (R-API-10)."""
        now = self._clock.now()
        forwards = call.timing.forwards if call.timing is not None else None
        rid = self.scheduler.submit(rows, now, tenant=call.tenant, priority=call.priority, exact=exact)
        loop = asyncio.get_running_loop()
        waiter = _Waiter(loop.create_future(), now, trace=forwards)
        self._waiters[rid] = waiter
        self._wake.set()
        if forwards is not None:
            self._traced += 1
        timers = [
            loop.call_later(max(0.0, seconds), self._expire, rid, frozenset(indices))
            for seconds, indices in _by_deadline(deadlines or ()).items()
        ]
        try:
            outputs = await waiter.future
        except asyncio.CancelledError:
            self.scheduler.cancel(rid)
            self._waiters.pop(rid, None)
            raise
        finally:
            for timer in timers:
                timer.cancel()
            if forwards is not None:
                self._traced -= 1
        queue_s = (waiter.first_forward or now) - waiter.arrival
        return ForwardStats(outputs, queue_s, waiter.forward_s, waiter.forwards, waiter.padded_tokens)

    def _expire(self, rid: int, indices: frozenset[int]) -> None:
        """The deadline of the request's rows at INDICES passed: the ones not started never will."""
        answer = self.scheduler.expire(rid, indices)
        if answer is not None:
            waiter = self._waiters.pop(rid, None)
            if waiter is not None and not waiter.future.done():
                waiter.future.set_result(answer.outputs)

    async def _drive(self) -> None:
        while True:
            batch = self.scheduler.next_forward(self._clock.now())
            device = self._device
            if batch is None and self._express is not None:
                batch = self.scheduler.next_express()
                device = self._express
            if batch is None:
                wake_at = self.scheduler.wake_at()
                self._wake.clear()
                if wake_at is None:
                    await self._wake.wait()
                else:
                    delay = wake_at - self._clock.now()
                    if delay > 0:
                        try:
                            await asyncio.wait_for(self._wake.wait(), delay)
                        except TimeoutError:
                            pass
                continue
            if self.scheduler.max_in_flight == 1 and device is self._device:
                # inline, not a task: the next forward is planned and handed to the device as soon as
                # this one returns, before the loop turns to writing this forward's answers (as a
                # task the device sat idle meanwhile: 84 % busy instead of 99 % under load, measured)
                await self._run(batch)
                continue
            task = asyncio.get_running_loop().create_task(self._run(batch, device), name="srun-forward")
            self._running.add(task)
            task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task) -> None:
        self._running.discard(task)
        self._wake.set()  # a slot is free: plan again

    async def _run(self, batch: ForwardBatch, device: DeviceThread | None = None) -> None:
        start = self._clock.now()
        batch_id, started = next(_BATCH_IDS), time.perf_counter()
        for rid in batch.request_ids:
            waiter = self._waiters.get(rid)
            if waiter is not None and waiter.first_forward is None:
                waiter.first_forward = start
        payloads = [row.payload for row in batch.rows]
        on_express = device is not None and device is self._express
        gate = self._gate if on_express and self.scheduler.yields_to(batch) else None
        if gate is not None:
            gate.hold()
        try:
            yields = not on_express and self.scheduler.may_yield(batch)
            outputs = await (device or self._device).hand_off(
                self._call, batch, payloads, self._gate if yields else None
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a failed forward fails exactly its requests
            seconds = self._clock.now() - start
            log.exception("forward failed (%d rows, %d tokens)", len(batch.rows), batch.tokens)
            self.forwards += 1
            if self._on_forward:
                self._on_forward(batch, seconds, False)
            self._trace(batch, batch_id, started, ok=False)
            for rid in self.scheduler.fail(batch):
                waiter = self._waiters.pop(rid, None)
                if waiter is not None and not waiter.future.done():
                    waiter.future.set_exception(ForwardFailed(f"forward failed: {type(exc).__name__}"))
            return
        finally:
            if gate is not None:
                gate.release()
        seconds = self._clock.now() - start
        self.forwards += 1
        if self._on_forward:
            self._on_forward(batch, seconds, True)
        self._trace(batch, batch_id, started, ok=True)
        for rid in batch.request_ids:
            waiter = self._waiters.get(rid)
            if waiter is not None:
                waiter.forward_s += seconds
                waiter.forwards += 1
                waiter.padded_tokens += batch.tokens
        for answer in self.scheduler.complete(batch, outputs, seconds):
            waiter = self._waiters.pop(answer.request_id, None)
            if waiter is not None and not waiter.future.done():
                waiter.future.set_result(answer.outputs)

    def _call(self, batch: ForwardBatch, payloads: list[Any], gate: YieldGate | None) -> Sequence[Any]:
        """The forward, on a device thread: a slot's pauses at its yield points while GATE is held."""
        if gate is None:  # most forwards: nothing to yield to
            return self._run_batch(batch, payloads)
        with yielding(gate):
            return self._run_batch(batch, payloads)

    def _trace(self, batch: ForwardBatch, batch_id: int, started: float, *, ok: bool) -> None:
        """A record of the forward for each traced request it ran rows of (made once, only then)."""
        if not self._traced:
            return
        record = None
        requests = batch.request_ids
        for rid in requests:
            waiter = self._waiters.get(rid)
            if waiter is None or waiter.trace is None:
                continue
            if record is None:
                record = ForwardRecord(
                    batch_id, batch.lane, len(batch.rows), len(requests), batch.tokens, started, time.perf_counter(), ok
                )
            waiter.trace.append(record)


def _by_deadline(deadlines: Sequence[float | None]) -> dict[float, list[int]]:
    """Row indices by their deadline (rows without one are left out)."""
    out: dict[float, list[int]] = {}
    for index, seconds in enumerate(deadlines):
        if seconds is not None:
            out.setdefault(seconds, []).append(index)
    return out
