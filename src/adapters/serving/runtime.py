"""The worker runtime: the served models, loading, and health.

It builds nothing it depends on: the composition root (`app/container.py`) hands it the model
store, the family and engine plugins, the device, the device thread, metrics, the result cache,
the clock and the load-time readiness checks. Loading runs on a background thread: resolve the
package, pick its family, load it on the device thread, check its surfaces' contracts, warm it
up, probe batch invariance (R-BAT-5), start its scheduler loop, run the golden check (R-GOLD-1).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Protocol

from vllm_srun.adapters.catalog import CATALOG
from vllm_srun.adapters.contracts import (
    Device,
    LoadContext,
    LoadedModel,
    ModelStore,
    Progress,
    quiet,
    surface_contract_problems,
)
from vllm_srun.adapters.engines.registry import EngineRegistry
from vllm_srun.adapters.families.registry import FamilyRegistry
from vllm_srun.adapters.schemas.models_list import TYPESAFE_DEFAULT_MODEL
from vllm_srun.adapters.serving.device_thread import DeviceThread
from vllm_srun.adapters.serving.metrics import RuntimeMetrics
from vllm_srun.adapters.serving.result_cache import ResultCache
from vllm_srun.adapters.serving.scheduler_loop import SchedulerLoop
from vllm_srun.adapters.serving.served import ServedModel, weights_sha256
from vllm_srun.domain import bounds
from vllm_srun.domain.admission import Admission, AdmissionLimits
from vllm_srun.domain.engine_args import EngineArgs, resolve_limits
from vllm_srun.domain.errors import InvalidRequest, ModelNotFound
from vllm_srun.domain.planning import Budget, ForwardBatch
from vllm_srun.domain.ports import Clock
from vllm_srun.domain.scheduler import Scheduler
from vllm_srun.domain.worker_settings import ModelSpec

log = logging.getLogger("vllm_srun.runtime")


class ReadinessChecks(Protocol):
    """The load-time checks (`adapters/readiness`): the probe and the golden check."""

    def probe(self, model: LoadedModel) -> bool | None:
        """R-BAT-5 on the device thread: batch-invariant? None: the family offers no probe."""
        ...

    async def golden(self, served: ServedModel) -> dict[str, Any]:
        """R-GOLD-1 on the event loop: the card's `golden` entry (status `failed` is final)."""
        ...


def _pending(admission: Admission, what: str) -> float:
    """The unanswered requests or tokens gauge of one model, read at every scrape."""
    return float(admission.pending_requests if what == "requests" else admission.pending_tokens)


def _ready_value(served: ServedModel) -> float:
    """The `ready` gauge of one model, read at every scrape."""
    return 1.0 if served.ready else 0.0


DEFAULT_ADMISSION = AdmissionLimits(bounds.MAX_QUEUE.default, bounds.MAX_QUEUED_TOKENS.default)


def model_spec(entry: ModelSpec | tuple[str, EngineArgs]) -> ModelSpec:
    """A served model's spec; `(artifact, engine args)` is the short form."""
    return entry if isinstance(entry, ModelSpec) else ModelSpec(entry[0], entry[1])


class Runtime:
    def __init__(
        self,
        models: Sequence[ModelSpec | tuple[str, EngineArgs]],
        *,
        store: ModelStore,
        families: FamilyRegistry,
        engines: EngineRegistry,
        device: Device,
        device_thread: DeviceThread,
        metrics: RuntimeMetrics,
        result_cache: ResultCache,
        clock: Clock,
        readiness: ReadinessChecks,
        engine_choice: str = "auto",
        threads: int | None = None,
        progress: Progress = quiet,
        admission: AdmissionLimits = DEFAULT_ADMISSION,
        open_device: Callable[[str], Device] | None = None,
    ) -> None:
        self.store = store
        self.families = families
        self.engines = engines
        self.device = device
        self.device_thread = device_thread
        self.metrics = metrics
        self.result_cache = result_cache  # one per worker (R-PERF-3)
        self.clock = clock
        self.readiness = readiness
        self.engine_choice = engine_choice
        self.threads = threads
        self.progress = progress
        self._open_device = open_device
        self._devices: dict[str, Device] = {device.name: device}
        self.models: dict[str, ServedModel] = {}
        for entry in models:
            spec = model_spec(entry)
            name = spec.served_name
            if name in self.models:
                raise InvalidRequest(f"model {name!r} is given twice")
            self.models[name] = ServedModel(
                name=name,
                artifact=spec.artifact,
                args=spec.args,
                device=device.name if spec.device in (None, "auto") else spec.device,
                cache=result_cache,
                admission=Admission(spec.admission or admission),
                clock=clock,
            )
        self.loaded = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    # ---- lookup ---------------------------------------------------------------------------
    def get(self, name: str | None) -> ServedModel:
        if name is None:
            if len(self.models) == 1:
                return next(iter(self.models.values()))
            raise InvalidRequest("several models are served: name one in `model`")
        found = self.models.get(name)
        if found is not None:
            return found
        for served in self.models.values():
            if name in (served.artifact, served.folder.name if served.folder else None):
                return served
        if name == TYPESAFE_DEFAULT_MODEL:  # the typesafe-sdk's default: the one decision model
            deciding = [s for s in self.models.values() if s.model is None or "decisions" in s.model.surfaces]
            if len(deciding) == 1:
                return deciding[0]
        raise ModelNotFound(f"model {name!r} is not served here (serving: {', '.join(self.models)})")

    def device_for(self, served: ServedModel) -> Device:
        """The device a model runs on: the worker's, or the one its models-file entry names."""
        found = self._devices.get(served.device)
        if found is None:
            if self._open_device is None:
                raise ValueError(f"model {served.name!r} names device {served.device!r} and no device can be opened")
            found = self._devices[served.device] = self._open_device(served.device)
        return found

    # ---- loading --------------------------------------------------------------------------
    def start_loading(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        for served in self.models.values():
            labels = {"model": served.name}
            self.metrics.ready.set_function(partial(_ready_value, served), labels)
            if served.admission is not None:
                self.metrics.unanswered.set_function(partial(_pending, served.admission, "requests"), labels)
                self.metrics.unanswered_tokens.set_function(partial(_pending, served.admission, "tokens"), labels)
        threading.Thread(target=self._load_all, name="srun-loader", daemon=True).start()

    def _load_all(self) -> None:
        for served in self.models.values():
            try:
                self._load(served)
            except Exception as exc:  # a model that cannot load fails alone; the card says why
                log.exception("model %s failed to load", served.name)
                served.status = "failed"
                served.reason = f"{type(exc).__name__}: {exc}"
                self.progress(f"load: {served.name} failed: {served.reason}")
        gc.collect()
        gc.freeze()
        self.loaded.set()

    def _load(self, served: ServedModel) -> None:
        served.status = "loading"
        self.progress(f"load: resolving {served.artifact}")
        try:
            folder = self.store.resolve(served.artifact, self.progress)
        except ModelNotFound:
            if served.artifact not in CATALOG:
                raise
            # a built-in model the store lacks: pull it (progress on stderr), as `vllm-srun pull` would
            self.progress(f"load: {served.artifact} is a built-in model not in the store yet: pulling it")
            folder = self.store.pull(served.artifact, self.progress)
        served.folder = folder
        family = self.families.family_for(folder)
        served.sha256 = weights_sha256(folder)  # before the load: engines key their caches by it
        device = self.device_for(served)
        context = LoadContext(
            device=device,
            args=served.args,
            engines=self.engines,
            engine_choice=self.engine_choice,
            threads=self.threads,
            package_sha256=served.sha256,
            cache_dir=self.store.engine_cache,
            progress=self.progress,
        )
        model = self.device_thread.call(family.load, folder, context)
        problems = surface_contract_problems(model)
        if problems:
            raise ValueError(f"the {family.name} family's model {'; '.join(problems)}")
        served.model = model
        served.plugins = [self.families.info(family.name).card()]
        if model.engine.name in self.engines.names():
            served.plugins.append(self.engines.info(model.engine.name).card())
        served.limits = resolve_limits(served.args, device.kind, device.memory_total())
        served.status = "warming"
        self.progress(f"load: warming {served.name}")
        self.device_thread.call(model.warm_up)
        invariant = self.device_thread.call(self.readiness.probe, model)  # R-BAT-5, before the scheduler exists
        if invariant is not None:
            model.batch_invariant = invariant
        assert self._loop is not None
        asyncio.run_coroutine_threadsafe(self._start_scheduler_loop(served), self._loop).result()
        if not self._golden_check(served):
            return
        served.status = "ready"
        self.progress(f"load: {served.name} ready ({model.family}, {', '.join(sorted(model.surfaces))})")

    def _golden_check(self, served: ServedModel) -> bool:
        """R-GOLD-1: the recorded requests, twice, through the serving path. False: failed (final)."""
        assert self._loop is not None
        self.progress(f"load: golden check of {served.name}")
        served.golden = asyncio.run_coroutine_threadsafe(self.readiness.golden(served), self._loop).result()
        status, reason = served.golden["status"], served.golden["reason"]
        self.progress(f"load: {served.name} golden {status}" + (f" ({reason})" if reason else ""))
        if status == "failed":
            served.status = "failed"
            served.reason = f"golden check failed: {reason}"
            return False
        return True

    async def _start_scheduler_loop(self, served: ServedModel) -> None:
        model = served.model
        limits = served.limits
        assert model is not None and limits is not None
        scheduler = Scheduler(
            model.lanes,
            Budget(limits.max_num_seqs, limits.max_num_batched_tokens),
            window_s=served.args.batch_window_ms / 1000,
            batch_invariant=model.batch_invariant,
        )

        def observe(batch: ForwardBatch, seconds: float, ok: bool, name: str = served.name) -> None:
            labels = {"model": name, "lane": batch.lane}
            self.metrics.forwards.inc({**labels, "outcome": "ok" if ok else "error"})
            self.metrics.forward_seconds.observe(seconds, labels)
            self.metrics.batch_rows.observe(len(batch.rows), labels)
            self.metrics.batch_tokens.observe(batch.tokens, labels)
            self.metrics.rows.inc(labels, len(batch.rows))
            if batch.tokens:
                self.metrics.batch_fill.observe(sum(r.tokens for r in batch.rows) / batch.tokens, labels)

        served.scheduler_loop = SchedulerLoop(
            scheduler, model.run, self.device_thread, clock=self.clock, on_forward=observe
        )
        served.scheduler_loop.start()
        self.metrics.queue_depth.set_function(lambda: float(scheduler.queued_rows), {"model": served.name})

    async def stop(self) -> None:
        for served in self.models.values():
            if served.scheduler_loop is not None:
                await served.scheduler_loop.stop()
        self.device_thread.shutdown()

    # ---- health ---------------------------------------------------------------------------
    def health(self) -> tuple[bool, dict[str, Any]]:
        statuses = {name: {"status": s.status, "reason": s.reason} for name, s in self.models.items()}
        ready = all(s.ready for s in self.models.values())
        if ready:
            overall = "ready"
        elif all(s.status == "failed" for s in self.models.values()):
            overall = "failed"
        elif any(s.status in ("starting", "loading", "warming") for s in self.models.values()):
            overall = next(s.status for s in self.models.values() if s.status in ("starting", "loading", "warming"))
        else:
            overall = "degraded"
        return ready, {"status": overall, "models": statuses}
