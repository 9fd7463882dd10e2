"""The worker's model table: its served models by name (lookup, the names and aliases clients
may use), their health, and stopping them. The models are loaded by the loader (`loader.py`),
which the table starts; each serves through its own `ServedModel` (`served.py`); their card is
built outside the serving core (`adapters/model_card.py`).

It builds nothing it depends on: the composition root (`app/bootstrap.py`) hands it the model
store, the family and engine plugins, the device, the device thread, metrics, the result cache,
the clock and the load-time readiness checks.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

from vllm_srun.adapters.contracts import (
    Device,
    EngineCatalog,
    FamilyFinder,
    MediaLoader,
    ModelStore,
    Progress,
    ThreadContext,
    quiet,
)
from vllm_srun.adapters.offload import Offload
from vllm_srun.adapters.serving.device_thread import DeviceThread
from vllm_srun.adapters.serving.loader import Calibrator, Loader, ReadinessChecks
from vllm_srun.adapters.serving.metrics import RuntimeMetrics
from vllm_srun.adapters.serving.result_cache import ResultCache
from vllm_srun.adapters.serving.served import ServedModel
from vllm_srun.domain.errors import InvalidRequest, ModelNotFound, quoted
from vllm_srun.domain.ports import Clock
from vllm_srun.domain.scheduling.admission import Admission
from vllm_srun.domain.scheduling.tenants import DEFAULT_TENANTS, TenantTable
from vllm_srun.domain.worker.adaptive_threads import Mode
from vllm_srun.domain.worker.lifecycle import NameTable, Unresolved, health, name_table, sole
from vllm_srun.domain.worker.worker_settings import RuntimeSettings

__all__ = ["Calibrator", "ReadinessChecks", "Runtime"]  # the ports the composition root fills


def _pending(admission: Admission, what: str) -> float:
    """The unanswered requests or tokens gauge of one model, or its tokens / token limit, read at
    every scrape."""
    if what == "ratio":
        return admission.pending_tokens / admission.limits.max_queued_tokens
    return float(admission.pending_requests if what == "requests" else admission.pending_tokens)


def _ready_value(served: ServedModel) -> float:
    """The `ready` gauge of one model, read at every scrape."""
    return 1.0 if served.ready else 0.0


class Runtime:
    """The served models of one worker (SETTINGS: `domain/worker/worker_settings.RuntimeSettings`, derived
    from the settings record by `bootstrap_worker`) and the adapters they are loaded and served
    with. DEFAULT_NAME: a name a client sends when its user names none (the typesafe-sdk's), which
    means the one decision model; None: no such name."""

    def __init__(
        self,
        settings: RuntimeSettings,
        *,
        store: ModelStore,
        families: FamilyFinder,
        engines: EngineCatalog,
        device: Device,
        device_thread: DeviceThread,
        metrics: RuntimeMetrics,
        result_cache: ResultCache,
        clock: Clock,
        readiness: ReadinessChecks,
        calibrator: Calibrator | None = None,
        media: MediaLoader | None = None,
        progress: Progress = quiet,
        thread_context: ThreadContext | None = None,
        open_device: Callable[[str], Device] | None = None,
        offload: Offload | None = None,
        tenants: TenantTable = DEFAULT_TENANTS,  # R-FAIR-1: weights and limits by tenant
        default_name: str | None = None,
    ) -> None:
        if settings.adaptive_threads is not Mode.OFF and device_thread.workers > 1:
            raise ValueError("adaptive threads time one forward at a time: they need --concurrent-forwards 1")
        self.settings = settings
        self.device = device  # the worker's (a models-file entry may name another: `device_for`)
        self.device_thread = device_thread
        self.metrics = metrics
        self.media = media  # decodes images and videos (R-MEDIA), started when a model reads them
        self.default_name = default_name
        self.offload = offload if offload is not None else Offload(1)  # prepares large requests off the loop
        self.models: dict[str, ServedModel] = {}
        for spec in settings.models:
            name = spec.served_name
            if name in self.models:
                raise InvalidRequest(f"model {name!r} is given twice")
            self.models[name] = ServedModel(
                name=name,
                artifact=spec.artifact,
                args=spec.args,
                device=device.name if spec.device in (None, "auto") else spec.device,
                engine=spec.engine or settings.engine,  # a models file entry may name its own
                cache=result_cache,  # one per worker (R-PERF-3)
                admission=Admission(spec.admission or settings.admission, tenants=tenants),
                clock=clock,
                max_request_tokens=settings.max_request_tokens,
                offload=self.offload,
                revision=spec.revision,
                family=spec.family,
                memory_budget_gib=spec.memory_budget_gib,
                options=spec.options,
            )
        self._names = self._name_table()
        self.loader = Loader(
            settings,
            self.models,
            store=store,
            families=families,
            engines=engines,
            device=device,
            device_thread=device_thread,
            metrics=metrics,
            clock=clock,
            readiness=readiness,
            calibrator=calibrator,
            media=media,
            progress=progress,
            thread_context=thread_context,
            open_device=open_device,
            tenants=tenants,
            named=self._renamed,
        )

    @property
    def loaded(self) -> threading.Event:
        """Set once every model's loading ended (ready or failed)."""
        return self.loader.loaded

    # ---- lookup (`domain/worker/lifecycle`: names) -------------------------------------------------
    def get(self, name: str | None) -> ServedModel:
        found = self._names.resolve(name, self._implied)
        if found is Unresolved.UNNAMED:
            raise InvalidRequest("several models are served: name one in `model`")
        if found is Unresolved.UNKNOWN:
            raise ModelNotFound(f"model {quoted(name)} is not served here (serving: {', '.join(self.models)})")
        return self.models[found]

    def _name_table(self) -> NameTable:
        """Served names, and their artifacts and package folders as aliases (the first model listed wins)."""
        entries = [(s.name, (s.artifact, s.folder.name if s.folder else "")) for s in self.models.values()]
        return name_table(entries, first_wins=True)

    def _implied(self, name: str) -> str | None:
        """DEFAULT_NAME (the typesafe-sdk's, sent when its user names none): the one decision model
        (or model not loaded yet)."""
        if self.default_name is None or name != self.default_name:
            return None
        return sole(s.name for s in self.models.values() if s.model is None or "decisions" in s.model.surfaces)

    def _renamed(self) -> None:
        self._names = self._name_table()

    def device_for(self, served: ServedModel) -> Device:
        """The device a model runs on: the worker's, or the one its models-file entry names."""
        return self.loader.device_for(served)

    def start_loading(self, loop: asyncio.AbstractEventLoop) -> None:
        """Count each model's gauges, then load them all (`Loader.start`)."""
        for served in self.models.values():
            labels = {"model": served.name}
            self.metrics.ready.set_function(partial(_ready_value, served), labels)
            if served.admission is not None:
                self.metrics.unanswered.set_function(partial(_pending, served.admission, "requests"), labels)
                self.metrics.unanswered_tokens.set_function(partial(_pending, served.admission, "tokens"), labels)
                self.metrics.queued_work.set_function(partial(_pending, served.admission, "ratio"), labels)
        self.loader.start(loop)

    async def stop(self) -> None:
        for served in self.models.values():
            if served.scheduler_loop is not None:
                await served.scheduler_loop.stop()
        if self.media is not None:
            await self.media.stop()
        self.device_thread.shutdown()
        if self.loader.express_thread is not None:
            self.loader.express_thread.shutdown()
        self.offload.shutdown()

    # ---- health ---------------------------------------------------------------------------
    def health(self) -> tuple[bool, dict[str, Any]]:
        """`/health`'s answer but its `api_version` (`schemas/health.Health`, added by the HTTP
        app): ready or not, why not (the first model that is not ready: its reason or state, named
        when there are several), the one model's id, and each model's status (`domain/worker/lifecycle`:
        health)."""
        statuses = {name: {"status": s.status.value, "reason": s.reason} for name, s in self.models.items()}
        overall = health(s.status for s in self.models.values())
        waiting = next((s for s in self.models.values() if not s.ready), None)
        reason = None
        if waiting is not None:
            why = waiting.reason or waiting.status.value
            reason = why if len(self.models) == 1 else f"{waiting.name}: {why}"
        only = next(iter(self.models)) if len(self.models) == 1 else None
        body = {"status": overall.status, "reason": reason, "model": only}
        return overall.ready, {**body, "models": statuses}
