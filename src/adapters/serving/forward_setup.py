"""How a loaded model's forwards run (R-CPU-1, R-CPU-2, R-FAIR-7): its `ForwardRunner` at the
configured thread count, an adaptive thread learner where `VLLM_SRUN_CPU_ADAPTIVE_THREADS` asks
for one and the engine can vary its count (its learned counts and shadow runs counted in the
metrics), the thread count of a forward alone on the device (`lone_forward_threads`), and what
the card reports of the worker's thread settings (`model_setup.ForwardSetup`). The loader
(`loader.py`) asks for it once a model is warm and probed."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from functools import partial

from vllm_srun.adapters.contracts import Device, LoadedModel, Progress, ThreadContext
from vllm_srun.adapters.serving.device_thread import DeviceThread
from vllm_srun.adapters.serving.forward_threads import ForwardRunner, lone_forward_threads
from vllm_srun.adapters.serving.metrics import RuntimeMetrics
from vllm_srun.adapters.serving.model_setup import ForwardSetup
from vllm_srun.domain.ports import Clock
from vllm_srun.domain.worker.adaptive_threads import BUCKET_EDGES, Mode, ThreadLearner, bucket_label, candidate_counts
from vllm_srun.domain.worker.threads import express_forward, lane_yield
from vllm_srun.domain.worker.worker_settings import RuntimeSettings


def _learned_value(learner: ThreadLearner, bucket: int) -> float:
    """A bucket's learned thread count (0 until learned), read at every scrape."""
    return float(learner.learned(bucket) or 0)


def forward_setup(
    name: str,
    model: LoadedModel,
    device: Device,
    settings: RuntimeSettings,
    device_thread: DeviceThread,
    *,
    thread_context: ThreadContext | None,
    metrics: RuntimeMetrics,
    clock: Clock,
    loop: asyncio.AbstractEventLoop,
    busy: Callable[[], int],
    progress: Progress,
) -> ForwardSetup:
    """How model NAME's forwards run on DEVICE: at the configured thread count, and with an
    adaptive learner where `VLLM_SRUN_CPU_ADAPTIVE_THREADS` asks for one and the engine can vary
    its count; LOOP gets the learner's shadow counts, BUSY() counts the forwards running beside
    one (its lone count)."""
    engine = model.engine
    follows = device.kind == "cpu" and engine.forward_threads and settings.threads is not None
    context = thread_context if follows else None
    learner, why = None, None
    if settings.adaptive_threads is Mode.OFF:
        why = "off (VLLM_SRUN_CPU_ADAPTIVE_THREADS=0)"
    elif device.kind != "cpu" or settings.threads is None:
        why = f"no CPU thread count to vary on device {device.name}"
    elif not engine.forward_threads:
        why = f"the {engine.name} engine fixes its thread count when it is built"
    elif context is not None:
        budget = settings.thread_budget or settings.threads
        learner = ThreadLearner(settings.adaptive_threads, settings.threads, candidate_counts(settings.threads, budget))
        for index in range(len(BUCKET_EDGES) + 1):
            metrics.adaptive_learned.set_function(
                partial(_learned_value, learner, index), {"model": name, "bucket": bucket_label(index)}
            )

    def on_shadow(count: int, matched: bool) -> None:
        labels = {"model": name, "threads": str(count), "outcome": "match" if matched else "drift"}
        loop.call_soon_threadsafe(metrics.adaptive_shadows.inc, labels)

    lone, why_not_lone = lone_forward_threads(
        model,
        context,
        team=settings.threads,
        budget=settings.thread_budget,
        workers=device_thread.workers,
        learning=learner is not None,
        deterministic=settings.deterministic,
        call=device_thread.call,
        env=os.environ,
    )
    if lone is not None:
        progress(f"load: a forward alone on the device runs on {lone} threads (same answers as on {settings.threads})")
    runner = ForwardRunner(
        model.run,
        context=context,
        configured=settings.threads if context is not None else None,
        learner=learner,
        clock=clock,
        enqueue=device_thread.enqueue,
        on_shadow=on_shadow,
        why_not_adaptive=why,
        lone=lone,
        busy=busy,
        why_not_lone=why_not_lone,
    )
    cpu = device.kind == "cpu"
    express = cpu and device_thread.workers > 1 and express_forward(os.environ)
    return ForwardSetup(
        runner,
        thread_budget=settings.thread_budget,
        wait_policy=settings.wait_policy,
        concurrent_forwards=device_thread.workers if cpu else 1,
        forward_nice=device_thread.nice if cpu else 0,
        express_forward=express,
        lane_yield=express and len(model.lanes) > 1 and lane_yield(os.environ),
    )
