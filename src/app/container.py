"""The composition root (dependency-injector): every adapter the worker and the front use is
declared here, and nothing else builds one.

`WorkerContainer` wires `vllm-srun serve` (and every in-process runtime: the golden recorder,
the fixture writer, the tests); `FrontContainer` wires `vllm-sr serve`. The CLIs parse their
flags into the container's config and call it. Tests override providers with fakes, e.g.
`container.store.override(providers.Object(FakeStore(...)))` or `container.families.override(...)`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from dependency_injector import containers, providers

from vllm_srun.adapters.clock import MonotonicClock
from vllm_srun.adapters.contracts import Device, Progress, ThreadContext, quiet
from vllm_srun.adapters.devices.torch_devices import TorchProbe, open_device
from vllm_srun.adapters.engines.registry import EngineRegistry
from vllm_srun.adapters.engines.threads import TorchThreadContext
from vllm_srun.adapters.families.registry import FamilyRegistry
from vllm_srun.adapters.front.app import FrontApp
from vllm_srun.adapters.front.fleet import Fleet
from vllm_srun.adapters.front.metrics import FrontEvents, FrontMetrics
from vllm_srun.adapters.front.proxy import Proxy
from vllm_srun.adapters.front.reconfigure import Reconfigurer
from vllm_srun.adapters.http.app import create_app
from vllm_srun.adapters.http.connection_guard import watched_guard
from vllm_srun.adapters.media.service import MediaService
from vllm_srun.adapters.model_store import LocalModelStore
from vllm_srun.adapters.offload import Offload
from vllm_srun.adapters.readiness.golden import LoadTimeChecks
from vllm_srun.adapters.serving.calibration import KneeCalibrator
from vllm_srun.adapters.serving.device_thread import DeviceThread
from vllm_srun.adapters.serving.metrics import RuntimeMetrics
from vllm_srun.adapters.serving.result_cache import ResultCache
from vllm_srun.adapters.serving.runtime import DEFAULT_ADMISSION, Runtime
from vllm_srun.domain import bounds
from vllm_srun.domain.adaptive_threads import Mode
from vllm_srun.domain.admission import AdmissionLimits
from vllm_srun.domain.connections import ConnectionLimits
from vllm_srun.domain.engine_args import EngineArgs
from vllm_srun.domain.threads import preparation_threads
from vllm_srun.domain.worker_settings import ModelSpec


def offload_for(forward_threads: int | None) -> Offload:
    """The pool that prepares large requests off the event loop, sized from the forward threads."""
    return Offload(preparation_threads(forward_threads or 1))


def device_thread_for(
    device: Device, concurrent: int, threads: int | None, nice: int, context: ThreadContext, progress: Progress
) -> DeviceThread:
    """The device's forward threads: CONCURRENT on a CPU (`--concurrent-forwards`), each declaring
    THREADS (one forward's team) when it starts, so loading and the readiness checks run on the
    count forwards serve at, and each NICE below the event loop's priority; one on a GPU (its
    launches are serialised anyway; its thread mostly waits, so it keeps the loop's priority)."""
    if device.kind != "cpu":
        if concurrent > 1:
            progress(f"load: --concurrent-forwards {concurrent} applies to CPUs; {device.name} runs one at a time")
        return DeviceThread()
    declare = partial(context.declare, threads) if threads is not None and concurrent > 1 else None
    return DeviceThread(workers=concurrent, initializer=declare, nice=nice)


class WorkerContainer(containers.DeclarativeContainer):
    """`vllm-srun serve`: store, plugins, device, device thread, metrics, cache, readiness checks,
    the GPU calibration, the runtime and its HTTP app."""

    config = providers.Configuration()

    clock = providers.Singleton(MonotonicClock)
    store = providers.Singleton(LocalModelStore.from_env)
    families = providers.Singleton(FamilyRegistry)
    engines = providers.Singleton(EngineRegistry)
    device_probe = providers.Singleton(TorchProbe)  # what torch says the machine has (tests: a fake)
    device = providers.Singleton(open_device, config.device, probe=device_probe, progress=config.progress)
    thread_context = providers.Singleton(TorchThreadContext)  # every forward declares its count (R-CPU-2)
    device_thread = providers.Singleton(
        device_thread_for,
        device,
        config.concurrent_forwards,
        config.threads,
        config.forward_nice,
        thread_context,
        config.progress,
    )
    metrics = providers.Singleton(RuntimeMetrics)
    result_cache = providers.Singleton(ResultCache, config.result_cache_entries, metrics.provided.cache)
    readiness = providers.Singleton(LoadTimeChecks, check_golden=config.check_golden)
    calibrator = providers.Singleton(KneeCalibrator)
    media = providers.Singleton(
        MediaService, config.media_workers, metrics=metrics, workers_source=config.media_workers_source
    )
    offload = providers.Singleton(offload_for, config.threads)

    runtime = providers.Singleton(
        Runtime,
        models=config.models,
        store=store,
        families=families,
        engines=engines,
        device=device,
        device_thread=device_thread,
        metrics=metrics,
        result_cache=result_cache,
        clock=clock,
        readiness=readiness,
        calibrator=calibrator,
        media=media,
        engine_choice=config.engine,
        threads=config.threads,
        progress=config.progress,
        thread_context=thread_context,
        thread_budget=config.thread_budget,
        adaptive_threads=config.adaptive_threads,
        wait_policy=config.wait_policy,
        deterministic=config.deterministic,
        admission=config.admission,
        open_device=providers.Factory(partial, open_device, probe=device_probe, progress=config.progress),
        offload=offload,
        max_request_tokens=config.max_request_tokens,
    )

    app = providers.Singleton(
        create_app,
        runtime=runtime,
        runtime_metrics=metrics,
        offload=offload,
        max_request_bytes=config.max_request_bytes,
        max_bundle_tasks=config.max_bundle_tasks,
        clock=clock.provided.now,  # the Retry-After holds read the runtime's clock
    )
    connection_guard = providers.Singleton(
        watched_guard, config.connection_limits, metrics, offload.provided.release_memory
    )


def worker_container(
    models: Sequence[ModelSpec | tuple[str, EngineArgs]],
    *,
    device: str = "cpu",
    engine: str = "auto",
    threads: int | None = None,
    concurrent_forwards: int = 1,
    forward_nice: int = 0,
    progress: Progress = quiet,
    max_request_bytes: int = bounds.MAX_REQUEST_BYTES.default,
    result_cache_entries: int = bounds.RESULT_CACHE_ENTRIES.default,
    check_golden: bool = True,
    media_workers: int | None = None,
    thread_budget: int | None = None,
    adaptive_threads: Mode = Mode.OFF,
    wait_policy: str | None = None,
    deterministic: bool = False,
    admission: AdmissionLimits = DEFAULT_ADMISSION,
    max_bundle_tasks: int = bounds.MAX_BUNDLE_TASKS.default,
    max_request_tokens: int = bounds.MAX_REQUEST_TOKENS.default,
    connection_limits: ConnectionLimits | None = None,
) -> WorkerContainer:
    """A worker container with every setting given (defaults: the CLI's, except one forward at a
    time at the loop's priority: the CLI decides those from the CPUs, `cli.cpu_settings`;
    `media_workers` None: one per 16 CPUs of the budget, 1 to 4)."""
    source = "set"
    if media_workers is None:
        from vllm_srun.adapters.workers.cpu_budget import front_cpu_budget
        from vllm_srun.domain.media import default_media_workers

        media_workers, source = default_media_workers(front_cpu_budget()), "default"
    container = WorkerContainer()
    container.config.from_dict(
        {
            "models": list(models),
            "device": device,
            "engine": engine,
            "threads": threads,
            "concurrent_forwards": concurrent_forwards,
            "forward_nice": forward_nice,
            "progress": progress,
            "max_request_bytes": max_request_bytes,
            "result_cache_entries": result_cache_entries,
            "check_golden": check_golden,
            "media_workers": media_workers,
            "media_workers_source": source,
            "thread_budget": thread_budget,
            "adaptive_threads": adaptive_threads,
            "wait_policy": wait_policy,
            "deterministic": deterministic,
            "admission": admission,
            "max_bundle_tasks": max_bundle_tasks,
            "max_request_tokens": max_request_tokens,
            "connection_limits": connection_limits or ConnectionLimits(),
        }
    )
    return container


class FrontContainer(containers.DeclarativeContainer):
    """`vllm-sr serve`: metrics and events, the fleet (workers, pools), the proxy and the app."""

    config = providers.Configuration()

    clock = providers.Object(time.monotonic)
    store = providers.Singleton(LocalModelStore.from_env)
    families = providers.Singleton(FamilyRegistry)
    metrics = providers.Singleton(FrontMetrics)
    events = providers.Singleton(FrontEvents, metrics)
    fleet = providers.Singleton(
        Fleet,
        config.front_config,
        socket_dir=config.socket_dir,
        threads=config.threads,
        max_request_bytes=config.max_request_bytes,
        events=events,
        worker_log_level=config.worker_log_level,
        env=config.env,
        clock=clock,
    )
    offload = providers.Singleton(Offload, 1)  # the front only decodes bodies: one thread keeps the loop free
    proxy = providers.Singleton(
        Proxy, fleet, metrics, max_request_bytes=config.max_request_bytes, clock=clock, offload=offload
    )
    reconfigurer = providers.Singleton(Reconfigurer, fleet, load=config.load_config, check=config.check_config)
    app = providers.Singleton(FrontApp, fleet, proxy, metrics, reconfigurer)
    connection_guard = providers.Singleton(
        watched_guard, config.connection_limits, metrics, offload.provided.release_memory
    )


def front_container(
    front_config: Any,
    *,
    socket_dir: str,
    threads: int | None,
    max_request_bytes: int,
    worker_log_level: str = "warning",
    env: dict[str, str] | None = None,
    load_config: Callable[[], Any] | None = None,
    connection_limits: ConnectionLimits | None = None,
) -> FrontContainer:
    """LOAD_CONFIG reads the config again for a reload (default: the same config, unchanged)."""
    container = FrontContainer()
    container.config.from_dict(
        {
            "front_config": front_config,
            "socket_dir": socket_dir,
            "threads": threads,
            "max_request_bytes": max_request_bytes,
            "worker_log_level": worker_log_level,
            "env": env,
            "load_config": load_config or (lambda: front_config),
            "check_config": lambda config: None,
            "connection_limits": connection_limits or ConnectionLimits(),
        }
    )
    return container
