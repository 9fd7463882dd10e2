"""The composition roots: `bootstrap_worker(settings, **adapters)` wires `vllm-srun serve` (and
every in-process runtime: the golden recorder, the fixture writer, the tests) from one settings
record (`adapters/config/settings.WorkerSettings`); `bootstrap_front(config, **adapters)` wires
`vllm-sr serve` from its canonical config. Every adapter the worker and the front use is declared
here, and nothing else builds one. A keyword names a provider to replace with a ready object
(a fake in tests): `bootstrap_worker(settings, families=..., device=FakeDevice())`.

dependency-injector stays, for what it still does here (docs/design.md, "Composition"): every
part is a lazy singleton built in dependency order on first use, so `vllm-srun pull` builds only
the store, `check_worker` reads the plugins before the runtime opens a device, and a test that
replaces the device never probes torch; `bootstrap_*`'s keywords map one to one onto its
overrides. What it no longer does is relay settings: the worker container holds the one record
(its `settings` provider) and each provider reads its field there, no config dict between them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from dependency_injector import containers, providers

from vllm_srun.adapters.clock import MonotonicClock
from vllm_srun.adapters.config.settings import WorkerSettings
from vllm_srun.adapters.contracts import Device, Progress, ThreadContext, quiet
from vllm_srun.adapters.devices.torch_devices import TorchProbe, open_device
from vllm_srun.adapters.engines.registry import installed_engines
from vllm_srun.adapters.engines.threads import TorchThreadContext
from vllm_srun.adapters.families.registry import FamilyRegistry
from vllm_srun.adapters.front.app import FrontApp
from vllm_srun.adapters.front.fleet import Fleet
from vllm_srun.adapters.front.metrics import FrontEvents, FrontMetrics
from vllm_srun.adapters.front.proxy import Proxy
from vllm_srun.adapters.front.reconfigure import READY_TIMEOUT_S, Reconfigurer
from vllm_srun.adapters.http.app import create_app
from vllm_srun.adapters.http.auth import Authenticator
from vllm_srun.adapters.http.connection_guard import watched_guard
from vllm_srun.adapters.media.service import MediaService
from vllm_srun.adapters.model_store import LocalModelStore
from vllm_srun.adapters.offload import Offload
from vllm_srun.adapters.readiness.golden import LoadTimeChecks
from vllm_srun.adapters.schemas.models_list import TYPESAFE_DEFAULT_MODEL
from vllm_srun.adapters.serving.calibration import KneeCalibrator
from vllm_srun.adapters.serving.device_thread import DeviceThread
from vllm_srun.adapters.serving.metrics import RuntimeMetrics
from vllm_srun.adapters.serving.result_cache import ResultCache
from vllm_srun.adapters.serving.runtime import Runtime
from vllm_srun.adapters.tracing.setup import tracer_from_env
from vllm_srun.domain.scheduling.read_pacing import floor_for
from vllm_srun.domain.scheduling.tenants import DEFAULT_TENANTS
from vllm_srun.domain.security.connections import ConnectionLimits
from vllm_srun.domain.settings import bounds
from vllm_srun.domain.worker.adaptive_threads import Mode
from vllm_srun.domain.worker.load_retries import LoadRetryPolicy
from vllm_srun.domain.worker.threads import CpuPlan, preparation_threads
from vllm_srun.domain.worker.worker_settings import ModelSpec, RuntimeSettings


def offload_for(forward_threads: int | None) -> Offload:
    """The pool that prepares large requests off the event loop, sized from the forward threads."""
    return Offload(preparation_threads(forward_threads or 1))


def device_thread_for(
    device: Device, cpu: CpuPlan | None, threads: int | None, context: ThreadContext, progress: Progress
) -> DeviceThread:
    """The device's forward threads: the CPU plan's concurrent forwards on a CPU
    (`--concurrent-forwards`; no plan: one), each declaring THREADS (one forward's team) when it
    starts, so loading and the readiness checks run on the count forwards serve at, and each the
    plan's nice increment below the event loop's priority; one on a GPU (its launches are
    serialised anyway; its thread mostly waits, so it keeps the loop's priority)."""
    concurrent, nice = (cpu.concurrent, cpu.forward_nice) if cpu is not None else (1, 0)
    if device.kind != "cpu":
        if concurrent > 1:
            progress(f"load: --concurrent-forwards {concurrent} applies to CPUs; {device.name} runs one at a time")
        return DeviceThread()
    declare = partial(context.declare, threads) if threads is not None and concurrent > 1 else None
    return DeviceThread(workers=concurrent, initializer=declare, nice=nice)


def media_service(settings: WorkerSettings, metrics: RuntimeMetrics) -> MediaService:
    """The media decoders: `--media-workers`, else one per 16 CPUs of the budget (R-MEDIA)."""
    if settings.media_workers is not None:
        return MediaService(settings.media_workers, metrics=metrics, workers_source="set")
    from vllm_srun.adapters.workers.cpu_budget import front_cpu_budget
    from vllm_srun.domain.inputs.media import default_media_workers

    return MediaService(default_media_workers(front_cpu_budget()), metrics=metrics, workers_source="default")


def runtime_settings(
    settings: WorkerSettings,
    specs: Sequence[ModelSpec] | None = None,
    cpu: CpuPlan | None = None,
    adaptive_threads: Mode = Mode.OFF,
    wait_policy: str | None = None,
) -> RuntimeSettings:
    """The runtime's settings, derived from the record here and nowhere else: SPECS (default: the
    record's MODEL arguments with its per-model settings), one forward's team and the CPU budget
    from CPU (default: the record's `--threads`, no budget)."""
    return RuntimeSettings(
        models=tuple(specs if specs is not None else settings.model_specs(settings.models)),
        engine=settings.engine_name,
        threads=cpu.team if cpu is not None else settings.threads,
        thread_budget=cpu.cpu_budget if cpu is not None else None,
        adaptive_threads=adaptive_threads,
        wait_policy=wait_policy,
        deterministic=settings.deterministic,
        admission=settings.admission(),
        max_request_tokens=_or(settings.max_request_tokens, bounds.MAX_REQUEST_TOKENS.default),
        load_retry=LoadRetryPolicy(settings.load_attempts, settings.load_retry_seconds),
    )


def read_floor(runtime: RuntimeSettings) -> int:
    """The requests a tenant may always hold in progress (R-FAIR-5), under the smallest queue
    limit of the models served (a model's own `max_queue`, else the worker's)."""
    limits = [(spec.admission or runtime.admission).max_queue for spec in runtime.models]
    return floor_for(min(limits, default=runtime.admission.max_queue))


class WorkerContainer(containers.DeclarativeContainer):
    """`vllm-srun serve`: store, plugins, device, device thread, metrics, cache, readiness checks,
    the GPU calibration, the runtime and its HTTP app. Its settings are the one record
    (`settings`, a `WorkerSettings`) and what `bootstrap_worker` is told besides it (the models'
    specs, the CPU plan, the adaptive mode, the wait policy, progress), each read where it is used."""

    settings = providers.Dependency(instance_of=WorkerSettings)
    specs: providers.Object[Sequence[ModelSpec] | None] = providers.Object(None)  # None: the record's MODELs
    cpu: providers.Object[CpuPlan | None] = providers.Object(None)  # None: `--threads`, one forward at a time
    adaptive_threads = providers.Object(Mode.OFF)
    wait_policy: providers.Object[str | None] = providers.Object(None)
    progress: providers.Object[Progress] = providers.Object(quiet)
    check_golden = providers.Object(True)

    clock = providers.Singleton(MonotonicClock)
    # Hub ids resolve in `--cache-dir` (default huggingface_hub's), never fetched with `--offline` (R-PKG-5)
    store = providers.Singleton(
        LocalModelStore.from_env, hub_cache=settings.provided.hub_cache, offline=settings.provided.offline
    )
    families = providers.Singleton(FamilyRegistry)
    engines = providers.Callable(installed_engines)  # read once per process (cached)
    device_probe = providers.Singleton(TorchProbe)  # what torch says the machine has (tests: a fake)
    device = providers.Singleton(open_device, settings.provided.device, probe=device_probe, progress=progress)
    thread_context = providers.Singleton(TorchThreadContext)  # every forward declares its count (R-CPU-2)
    # the runtime's settings, derived from the record (and the CPU plan) in one place
    derived_settings = providers.Singleton(
        runtime_settings,
        settings,
        specs,
        cpu,
        adaptive_threads,
        wait_policy,
    )
    device_thread = providers.Singleton(
        device_thread_for, device, cpu, derived_settings.provided.threads, thread_context, progress
    )
    metrics = providers.Singleton(RuntimeMetrics)
    result_cache = providers.Singleton(ResultCache, settings.provided.result_cache_size, metrics.provided.cache)
    readiness = providers.Singleton(LoadTimeChecks, check_golden=check_golden)
    calibrator = providers.Singleton(KneeCalibrator)
    media = providers.Singleton(media_service, settings, metrics)
    offload = providers.Singleton(offload_for, derived_settings.provided.threads)
    retry_clock = providers.Callable(getattr, clock, "now")

    tenants = providers.Object(DEFAULT_TENANTS)  # weights and limits by tenant: the key file's (R-FAIR-1)
    runtime = providers.Singleton(
        Runtime,
        derived_settings,
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
        progress=progress,
        thread_context=thread_context,
        open_device=providers.Factory(partial, open_device, probe=device_probe, progress=progress),
        offload=offload,
        tenants=tenants,
        default_name=TYPESAFE_DEFAULT_MODEL,  # the typesafe-sdk's `model` when its user names none
    )

    # the key check (`http/auth.py`); the CLI's flags give one (R-AUTH)
    auth: providers.Object[Authenticator | None] = providers.Object(None)
    # spans from the OTEL_* variables (`adapters/tracing`; off unless OTEL_TRACES_EXPORTER names an exporter)
    tracer = providers.Singleton(tracer_from_env, providers.Object(os.environ), "vllm-srun")
    app = providers.Singleton(
        create_app,
        runtime=runtime,
        runtime_metrics=metrics,
        offload=offload,
        max_request_bytes=settings.provided.max_request_bytes,
        max_bundle_tasks=settings.provided.max_bundle_tasks,
        clock=retry_clock,  # the Retry-After holds: the runtime's clock (tests: a fake one)
        auth=auth,
        tracer=tracer,
    )
    # the record's connection limits; `check_worker` may lower max_connections to the descriptors there are
    connection_limits = providers.Singleton(getattr, settings, "connections")
    floor = providers.Singleton(read_floor, derived_settings)
    # one guard for every listener; requests read in turn by the tenants' weights (R-FAIR-5)
    connection_guard = providers.Singleton(
        watched_guard, connection_limits, metrics, offload.provided.release_memory, tenants, floor
    )


def bootstrap_worker(
    settings: WorkerSettings | None = None,
    *,
    specs: Sequence[ModelSpec] | None = None,
    cpu: CpuPlan | None = None,
    adaptive_threads: Mode = Mode.OFF,
    wait_policy: str | None = None,
    progress: Progress = quiet,
    check_golden: bool = True,
    **adapters: Any,
) -> WorkerContainer:
    """The worker of SETTINGS (default: the CLI's defaults). SPECS: the models to serve (default:
    SETTINGS' MODEL arguments with its per-model settings); CPU: how the forwards use the CPUs
    (default: SETTINGS' threads, one forward at a time at the loop's priority: the CLI decides
    those from the CPUs, `cli.cpu_settings`); ADAPTERS: providers replaced by ready objects."""
    container = WorkerContainer()
    container.settings.override(settings or WorkerSettings())
    given = {
        "specs": specs,
        "cpu": cpu,
        "adaptive_threads": adaptive_threads,
        "wait_policy": wait_policy,
        "progress": progress,
        "check_golden": check_golden,
    }
    for name, value in given.items():
        getattr(container, name).override(providers.Object(value))
    container.derived_settings()  # a combination the runtime cannot honour is refused now, before anything is built
    _override(container, adapters)
    return container


def _override(container: containers.Container, adapters: dict[str, Any]) -> None:
    """Replace each named provider by its ready object; an unknown name is a TypeError."""
    for name, value in adapters.items():
        provider = getattr(container, name, None)
        if not isinstance(provider, providers.Provider) or name in ("config", "settings"):
            raise TypeError(f"{type(container).__name__} has no adapter {name!r}")
        provider.override(providers.Object(value))


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


class FrontContainer(containers.DeclarativeContainer):
    """`vllm-sr serve`: metrics and events, the fleet (workers, pools), the proxy and the app."""

    config = providers.Configuration()

    clock = providers.Object(time.monotonic)
    store = providers.Singleton(LocalModelStore.from_env, hub_cache=config.hub_cache, offline=config.offline)
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
        tenant_policies=config.tenant_policies,
    )
    offload = providers.Singleton(Offload, 1)  # the front only decodes bodies: one thread keeps the loop free
    tracer = providers.Singleton(tracer_from_env, providers.Object(os.environ), "vllm-sr")  # as the worker's
    proxy = providers.Singleton(
        Proxy, fleet, metrics, max_request_bytes=config.max_request_bytes, clock=clock, offload=offload, tracer=tracer
    )
    reconfigurer = providers.Singleton(
        Reconfigurer, fleet, load=config.load_config, check=config.check_config, ready_timeout_s=config.ready_timeout_s
    )
    # the key check (`http/auth.py`); the CLI's flags give one (R-AUTH)
    auth: providers.Object[Authenticator | None] = providers.Object(None)
    app = providers.Singleton(FrontApp, fleet, proxy, metrics, reconfigurer, auth)
    connection_guard = providers.Singleton(
        watched_guard, config.connection_limits, metrics, offload.provided.release_memory
    )


def bootstrap_front(
    front_config: Any,
    *,
    socket_dir: str,
    threads: int | None = None,
    max_request_bytes: int = bounds.MAX_REQUEST_BYTES.default,
    worker_log_level: str = "warning",
    env: dict[str, str] | None = None,
    load_config: Callable[[], Any] | None = None,
    connection_limits: ConnectionLimits | None = None,
    reload_ready_timeout_s: float = READY_TIMEOUT_S,
    tenant_policies: str | None = None,
    hub_cache: str | None = None,
    offline: bool = False,
    **adapters: Any,
) -> FrontContainer:
    """The front of FRONT_CONFIG. LOAD_CONFIG reads the config again for a reload (default: the
    same config, unchanged), whose new workers have RELOAD_READY_TIMEOUT_S to become ready;
    TENANT_POLICIES: the front's key file, whose tenant policies its managed workers apply;
    HUB_CACHE and OFFLINE: where the front's checks resolve Hub ids (`--cache-dir`, `--offline`);
    ADAPTERS: providers replaced by ready objects (e.g. `clock`)."""
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
            "ready_timeout_s": reload_ready_timeout_s,
            "connection_limits": connection_limits or ConnectionLimits(),
            "tenant_policies": tenant_policies,
            "hub_cache": Path(hub_cache).expanduser() if hub_cache else None,
            "offline": offline,
        }
    )
    _override(container, adapters)
    return container
