"""The worker runtime: the served models, loading, and health.

It builds nothing it depends on: the composition root (`app/container.py`) hands it the model
store, the family and engine plugins, the device, the device thread, metrics, the result cache,
the clock and the load-time readiness checks. Loading runs on a background thread: resolve the
package, pick its family, load it on the device thread, check its surfaces' contracts, warm it
up, probe batch invariance (R-BAT-5), start its scheduler loop, run the golden check (R-GOLD-1)
and, on a GPU worker, calibrate an unset token budget (R-DEV-2), whose cost per token also seeds
the scheduler's cost model (R-BAT-7's device-seconds caps).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from vllm_srun.adapters.contracts import (
    Device,
    LoadContext,
    LoadedModel,
    MediaEmbedder,
    MediaLoader,
    ModelStore,
    Progress,
    quiet,
    surface_contract_problems,
)
from vllm_srun.adapters.engines.registry import EngineRegistry
from vllm_srun.adapters.families.registry import FamilyRegistry
from vllm_srun.adapters.serving.device_thread import DeviceThread
from vllm_srun.adapters.serving.metrics import RuntimeMetrics
from vllm_srun.adapters.serving.result_cache import ResultCache
from vllm_srun.adapters.serving.scheduler_loop import SchedulerLoop
from vllm_srun.adapters.serving.served import ServedModel, weights_sha256
from vllm_srun.domain.calibration import Calibration, CalibrationFailed
from vllm_srun.domain.engine_args import BatchingLimits, EngineArgs, calibrated_limits, resolve_limits
from vllm_srun.domain.errors import InvalidRequest, ModelNotFound
from vllm_srun.domain.planning import Budget, ForwardBatch
from vllm_srun.domain.ports import Clock
from vllm_srun.domain.scheduler import Scheduler

log = logging.getLogger("vllm_srun.runtime")


class ReadinessChecks(Protocol):
    """The load-time checks (`adapters/readiness`): the probe and the golden check."""

    def probe(self, model: LoadedModel) -> bool | None:
        """R-BAT-5 on the device thread: batch-invariant? None: the family offers no probe."""
        ...

    async def golden(self, served: ServedModel) -> dict[str, Any]:
        """R-GOLD-1 on the event loop: the card's `golden` entry (status `failed` is final)."""
        ...


class Calibrator(Protocol):
    """The GPU knee calibration (`serving/calibration.py`, R-DEV-2)."""

    def applies(self, device: Device) -> bool: ...

    def calibrate(
        self, model: LoadedModel, limits: BatchingLimits, device: Device, progress: Progress
    ) -> Calibration: ...


def _ready_value(served: ServedModel) -> float:
    """The `ready` gauge of one model, read at every scrape."""
    return 1.0 if served.ready else 0.0


def served_name(artifact: str) -> str:
    path = Path(artifact)
    return path.name if path.name else artifact


class Runtime:
    def __init__(
        self,
        models: Sequence[tuple[str, EngineArgs]],
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
        calibrator: Calibrator | None = None,
        media: MediaLoader | None = None,
        engine_choice: str = "auto",
        threads: int | None = None,
        progress: Progress = quiet,
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
        self.calibrator = calibrator
        self.media = media  # decodes images and videos (R-MEDIA), started when a model reads them
        self.engine_choice = engine_choice
        self.threads = threads
        self.progress = progress
        self.models: dict[str, ServedModel] = {}
        for artifact, args in models:
            name = served_name(artifact)
            if name in self.models:
                raise InvalidRequest(f"model {name!r} is given twice")
            self.models[name] = ServedModel(
                name=name, artifact=artifact, args=args, device=device.name, cache=result_cache
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
        raise ModelNotFound(f"model {name!r} is not served here (serving: {', '.join(self.models)})")

    # ---- loading --------------------------------------------------------------------------
    def start_loading(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        for served in self.models.values():
            self.metrics.ready.set_function(partial(_ready_value, served), {"model": served.name})
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
        folder = self.store.resolve(served.artifact, self.progress)
        served.folder = folder
        family = self.families.family_for(folder)
        served.sha256 = weights_sha256(folder)  # before the load: engines key their caches by it
        context = LoadContext(
            device=self.device,
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
        served.limits = resolve_limits(served.args, self.device.kind, self.device.memory_total())
        if isinstance(model, MediaEmbedder):
            if self.media is None:
                raise ValueError(f"the {family.name} family's model reads media, and this worker has no media loader")
            self.progress("load: starting the media decoders")
            self.media.start()
            served.media = self.media
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
        self._calibrate(served)
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

    def _calibrate(self, served: ServedModel) -> None:
        """R-DEV-2 on a GPU worker: time merged forwards, keep the knee; a set value stays."""
        model, limits = served.model, served.limits
        assert model is not None and limits is not None
        if self.calibrator is None or not self.calibrator.applies(self.device):
            return
        if limits.tokens_source == "set":
            served.calibration = {"status": "skipped", "reason": "max_num_batched_tokens is set"}
            return
        self.progress(f"load: calibrating the token budget of {served.name} on {self.device.name}")
        try:
            found = self.device_thread.call(self.calibrator.calibrate, model, limits, self.device, self.progress)
        except Exception as exc:  # the golden check passed: the model serves on its class budget, the card says why
            if not isinstance(exc, CalibrationFailed):
                log.exception("calibration of %s failed", served.name)
            reason = str(exc) if isinstance(exc, CalibrationFailed) else f"{type(exc).__name__}: {exc}"
            served.calibration = {"status": "failed", "reason": reason[:300]}
            self.progress(f"load: {served.name} keeps its class budget ({reason[:300]})")
            return
        served.limits = calibrated_limits(limits, found.tokens)
        served.calibration = found.card()
        assert self._loop is not None
        asyncio.run_coroutine_threadsafe(self._apply_calibration(served, found), self._loop).result()
        self.progress(
            f"load: {served.name} max_num_batched_tokens {found.tokens} calibrated (limited by {found.limited_by}; "
            f"{found.seconds_per_token:.3g} s/token; timed {[(t.tokens, t.seconds) for t in found.timings]})"
        )

    async def _apply_calibration(self, served: ServedModel, found: Calibration) -> None:
        """On the loop: the scheduler plans with the calibrated budget, its first lane's cost starts
        from the measured one (R-BAT-7's device-seconds caps)."""
        loop, limits, model = served.scheduler_loop, served.limits, served.model
        assert loop is not None and limits is not None and model is not None
        loop.scheduler.set_budget(Budget(limits.max_num_seqs, limits.max_num_batched_tokens))
        loop.scheduler.costs.seed(model.lanes[0].name, found.seconds_per_token)

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
        if self.media is not None:
            await self.media.stop()
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
