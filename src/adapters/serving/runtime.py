"""The worker runtime: the served models, the device thread, loading and health."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
from pathlib import Path
from typing import Callable

from vllm_srun.adapters import model_store
from vllm_srun.adapters.families.base import EngineFactory, LoadOptions
from vllm_srun.adapters.families.registry import family_for
from vllm_srun.adapters.readiness import golden
from vllm_srun.adapters.serving.device_thread import DeviceThread
from vllm_srun.adapters.serving.metrics import RuntimeMetrics
from vllm_srun.adapters.serving.scheduler_loop import SchedulerLoop
from vllm_srun.adapters.readiness.probe import probe_model
from vllm_srun.adapters.serving.result_cache import DEFAULT_RESULT_CACHE_ENTRIES, ResultCache
from vllm_srun.adapters.serving.served import ServedModel, weights_sha256
from vllm_srun.domain.engine_args import EngineArgs, resolve_limits
from vllm_srun.domain.errors import InvalidRequest, ModelNotFound
from vllm_srun.domain.planning import Budget, ForwardBatch
from vllm_srun.domain.scheduler import Scheduler

log = logging.getLogger("vllm_srun.runtime")
Progress = Callable[[str], None]


def served_name(artifact: str) -> str:
    path = Path(artifact)
    return path.name if path.name else artifact


class Runtime:
    def __init__(
        self,
        models: list[tuple[str, EngineArgs]],
        *,
        device: str = "cpu",
        engine: str = "auto",
        threads: int | None = None,
        progress: Progress | None = None,
        result_cache_entries: int | None = None,
        check_golden: bool = True,
        engines: EngineFactory | None = None,
    ) -> None:
        self.device_name = device
        self.engine = engine
        if engines is None:  # the composition root passes its own; tests and tools get the default
            from vllm_srun.adapters.engines.factory import default_engines

            engines = default_engines()
        self.engines = engines
        self.threads = threads
        self.metrics = RuntimeMetrics()
        self.device = DeviceThread(threads=threads)
        self.progress = progress or (lambda msg: log.info("%s", msg))
        entries = DEFAULT_RESULT_CACHE_ENTRIES if result_cache_entries is None else result_cache_entries
        self.result_cache = ResultCache(entries, self.metrics.cache)  # one per worker (R-PERF-3)
        self.check_golden = check_golden
        self.models: dict[str, ServedModel] = {}
        for artifact, args in models:
            name = served_name(artifact)
            if name in self.models:
                raise InvalidRequest(f"model {name!r} is given twice")
            self.models[name] = ServedModel(name=name, artifact=artifact, args=args, device=device, cache=self.result_cache)
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
            self.metrics.ready.set_function(lambda s=served: 1.0 if s.ready else 0.0, {"model": served.name})
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
        folder = model_store.resolve(served.artifact, progress=self.progress)
        served.folder = folder
        family = family_for(folder)
        served.sha256 = weights_sha256(folder)  # before the load: engines key their caches by it
        options = LoadOptions(device=self.device_name, engine=self.engine, args=served.args, threads=self.threads,
                              engines=self.engines, package_sha256=served.sha256)
        model = self.device.call(family.load, folder, options, self.progress)
        served.model = model
        served.limits = resolve_limits(served.args, self.device_name.split(":")[0], None)
        served.status = "warming"
        warm = getattr(model, "warm_up", None)
        if warm is not None:
            self.progress(f"load: warming {served.name}")
            self.device.call(warm)
        invariant = self.device.call(probe_model, model)  # R-BAT-5, before the scheduler exists
        if invariant is not None:
            model.batch_invariant = invariant
        assert self._loop is not None
        asyncio.run_coroutine_threadsafe(self._attach_scheduler_loop(served), self._loop).result()
        if self.check_golden and not self._golden_check(served, folder):
            return
        served.status = "ready"
        self.progress(f"load: {served.name} ready ({model.family}, {', '.join(sorted(model.surfaces))})")

    def _golden_check(self, served: ServedModel, folder: Path) -> bool:
        """R-GOLD-1: the recorded requests, twice, through the serving path. False: failed (final)."""
        assert self._loop is not None
        self.progress(f"load: golden check of {served.name}")
        path = golden.find_golden(folder, served.artifact)
        served.golden = asyncio.run_coroutine_threadsafe(golden.check(served, path, self.device_name), self._loop).result()
        status, reason = served.golden["status"], served.golden["reason"]
        self.progress(f"load: {served.name} golden {status}" + (f" ({reason})" if reason else ""))
        if status == "failed":
            served.status = "failed"
            served.reason = f"golden check failed: {reason}"
            return False
        return True

    async def _attach_scheduler_loop(self, served: ServedModel) -> None:
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

        served.scheduler_loop = SchedulerLoop(scheduler, model.run, self.device, on_forward=observe)
        served.scheduler_loop.start()
        self.metrics.queue_depth.set_function(lambda: float(scheduler.queued_rows), {"model": served.name})

    async def stop(self) -> None:
        for served in self.models.values():
            if served.scheduler_loop is not None:
                await served.scheduler_loop.stop()
        self.device.shutdown()

    # ---- health ---------------------------------------------------------------------------
    def health(self) -> tuple[bool, dict]:
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
