"""Loading one worker's models (the model table, `runtime.py`, starts it): resolve each package,
pick its family, place it on its device, load it on the device thread, check its surfaces'
contracts, warm it up, probe batch invariance (R-BAT-5), set up its forwards (`forward_setup.py`:
declared thread counts, adaptive threads, R-CPU-2), start its scheduler loop, run the golden
check (R-GOLD-1) and, on a GPU worker, calibrate an unset token budget (R-DEV-2), whose cost per
token also seeds the scheduler's cost model (R-BAT-7's device-seconds caps). With
`--deterministic` the engine says how it honours it (`Engine.determinism`): a batch-invariant
engine whose probe passes merges rows as usual; any other runs one row per forward.

What loading builds for a model to serve with is one immutable record (`model_setup.Serving`),
published whole at each step that adds to it. Loading runs on a background thread, one model
after the other. A load that fails transiently (R-LOAD-1: `load_failures.py` says which failures
are; a package, golden or capability failure never is) is tried again after a wait
(`domain/worker/load_retries.py`): the model stays `loading`, its reason says the attempt and the next
one, the other models load meanwhile.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import threading
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, Protocol

from vllm_srun.adapters.catalog import CATALOG
from vllm_srun.adapters.contracts import (
    AudioEmbedder,
    Determinism,
    Device,
    EngineCatalog,
    FamilyFinder,
    LoadContext,
    LoadedModel,
    MediaEmbedder,
    MediaLoader,
    MediaQuestionAnswerer,
    ModelStore,
    Progress,
    ThreadContext,
    surface_contract_problems,
)
from vllm_srun.adapters.lane_yield import YieldGate
from vllm_srun.adapters.serving.device_thread import BusyCount, DeviceThread
from vllm_srun.adapters.serving.forward_setup import forward_setup
from vllm_srun.adapters.serving.load_failures import PackageSnapshot, public_reason, transient_cause
from vllm_srun.adapters.serving.metrics import RuntimeMetrics
from vllm_srun.adapters.serving.model_checks import package_refusal
from vllm_srun.adapters.serving.model_setup import ForwardSetup, Serving, settled_profile
from vllm_srun.adapters.serving.package_facts import weights_sha256
from vllm_srun.adapters.serving.scheduler_loop import SchedulerLoop
from vllm_srun.adapters.serving.served import ServedModel
from vllm_srun.domain.errors import ModelNotFound, without_paths
from vllm_srun.domain.ports import Clock
from vllm_srun.domain.scheduling.planning import BATCH_INVARIANT_TOKENS
from vllm_srun.domain.scheduling.scheduler import Scheduler
from vllm_srun.domain.scheduling.tenants import TenantTable
from vllm_srun.domain.settings.engine_args import BatchingLimits, calibrated_limits, resolve_limits
from vllm_srun.domain.settings.profiles import never_coalesces, runs_alone
from vllm_srun.domain.worker.calibration import Calibration, CalibrationFailed
from vllm_srun.domain.worker.lifecycle import ModelState, decide_determinism
from vllm_srun.domain.worker.load_retries import attempt_reason, final_reason, waiting_reason
from vllm_srun.domain.worker.worker_settings import RuntimeSettings

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


class Loader:
    """Loads the models of MODELS (the model table's, by served name) with the adapters it is
    given; NAMED() is called once a model's package folder is known (a new alias)."""

    def __init__(
        self,
        settings: RuntimeSettings,
        models: Mapping[str, ServedModel],
        *,
        store: ModelStore,
        families: FamilyFinder,
        engines: EngineCatalog,
        device: Device,
        device_thread: DeviceThread,
        metrics: RuntimeMetrics,
        clock: Clock,
        readiness: ReadinessChecks,
        calibrator: Calibrator | None,
        media: MediaLoader | None,
        progress: Progress,
        thread_context: ThreadContext | None,
        open_device: Callable[[str], Device] | None,
        tenants: TenantTable,
        named: Callable[[], None],
    ) -> None:
        self.settings = settings
        self.models = models
        self.store = store
        self.families = families
        self.engines = engines
        self.device_thread = device_thread
        self.metrics = metrics
        self.clock = clock
        self.readiness = readiness
        self.calibrator = calibrator
        self.media = media  # decodes images and videos (R-MEDIA), started when a model reads them
        self.progress = progress
        self.thread_context = thread_context
        self.tenants = tenants
        self.express_thread: DeviceThread | None = None  # `_express_thread`
        # calls running on the device's threads, the express thread's included: a forward that
        # starts beside an express forward is not alone (`ForwardRunner`'s lone count)
        self._busy = BusyCount(device_thread)
        self._open_device = open_device
        self._devices: dict[str, Device] = {device.name: device}
        self._named = named
        self._snapshots: dict[str, PackageSnapshot] = {}  # each attempt's package files (R-LOAD-1)
        self._waiting: dict[str, tuple[int, str]] = {}  # a model waiting to load again: failed attempt, why
        self.loaded = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Load every model on a background thread; LOOP runs their scheduler loops and golden checks."""
        self._loop = loop
        threading.Thread(target=self.load_all, name="srun-loader", daemon=True).start()

    def device_for(self, served: ServedModel) -> Device:
        """The device a model runs on: the worker's, or the one its models-file entry names."""
        found = self._devices.get(served.device)
        if found is None:
            if self._open_device is None:
                raise ValueError(f"model {served.name!r} names device {served.device!r} and no device can be opened")
            found = self._devices[served.device] = self._open_device(served.device)
        return found

    def load_all(self) -> None:
        """Load every model in turn; a transient failure (R-LOAD-1) puts a model back in line for
        another attempt after its wait, and the others load meanwhile."""
        policy = self.settings.load_retry
        due: list[tuple[float, int, ServedModel]] = [(0.0, i, s) for i, s in enumerate(self.models.values())]
        failed: dict[str, int] = {}
        while due:
            due.sort(key=lambda item: item[:2])
            at, order, served = due.pop(0)
            self._wait_for_attempt(served, at)
            before = self._attempt(served)
            if before is None:
                continue
            exc, snapshot = before
            attempt = failed[served.name] = failed.get(served.name, 0) + 1
            why = public_reason(exc, served)
            # once a model serves (its scheduler loop runs: the golden check), a failure is final
            started = served.scheduler_loop is not None
            cause = None if started else transient_cause(exc, snapshot != PackageSnapshot.of(served.folder))
            delay = policy.next_delay(attempt, cause is not None)
            if delay is None:
                if not served.status.final:
                    served.become(ModelState.FAILED, final_reason(attempt, policy.attempts, why, cause is not None))
                self.progress(f"load: {served.name} failed: {served.reason}")
                continue
            self._back_in_line(served)
            self.progress(
                f"load: {served.name} failed (attempt {attempt} of {policy.attempts}; {cause}): {why}; "
                f"trying again in {delay:g} s"
            )
            due.append((time.monotonic() + delay, order, served))
            served.reason = waiting_reason(attempt, policy.attempts, delay, why)
            self._waiting[served.name] = (attempt, why)
        gc.collect()
        gc.freeze()
        self.loaded.set()

    def _attempt(self, served: ServedModel) -> tuple[Exception, PackageSnapshot] | None:
        """One load attempt of SERVED: None when it ended (ready, or failed for good by its golden
        check); else the exception and the package's files as they were when it was resolved."""
        self._snapshots.pop(served.name, None)
        try:
            self._load(served)
        except Exception as exc:  # a model that cannot load fails alone; the card says why
            log.exception("model %s failed to load", served.name)  # the log keeps the paths
            return exc, self._snapshots.pop(served.name, PackageSnapshot.of(served.folder))
        if served.ready:
            served.reason = None  # an earlier attempt's story is over
        return None

    def _wait_for_attempt(self, served: ServedModel, at: float) -> None:
        """Until AT (monotonic seconds), saying each second in SERVED's reason when its next
        attempt starts (`/health`, the card)."""
        waiting = self._waiting.pop(served.name, None)
        if waiting is None:
            return
        attempts = self.settings.load_retry.attempts
        while (left := at - time.monotonic()) > 0:
            served.reason = waiting_reason(waiting[0], attempts, left, waiting[1])
            time.sleep(min(left, (left % 1.0) or 1.0))  # to the next whole second left
        served.reason = attempt_reason(waiting[0] + 1, attempts, waiting[1])

    def _back_in_line(self, served: ServedModel) -> None:
        """SERVED, after a transient failure, as before its attempt: loading, nothing loaded."""
        if served.status is ModelState.WARMING:
            served.become(ModelState.LOADING)
        served.model = None
        served.serving = None
        gc.collect()  # what the failed attempt held (the device's memory too) goes before the next

    def _load(self, served: ServedModel) -> None:
        if served.status is ModelState.STARTING:
            served.become(ModelState.LOADING)
        self.progress(f"load: resolving {served.artifact}")
        target = served.target  # a Hub id at its revision (`ORG/NAME@REV`, `--revision`, a models file's)
        try:
            folder = self.store.resolve(target, self.progress)
        except ModelNotFound:
            if served.artifact not in CATALOG:
                raise
            # a built-in model the store lacks: pull it (progress on stderr), as `vllm-srun pull` would
            self.progress(f"load: {served.artifact} is a built-in model not in the store yet: pulling it")
            folder = self.store.pull(served.artifact, self.progress)
        served.folder = folder
        self._snapshots[served.name] = PackageSnapshot.of(folder)  # R-LOAD-1: did it change while read?
        self._named()  # its folder's name is an alias now
        family = self.families.family_for(folder, served.family)
        served.sha256 = weights_sha256(folder)  # before the load: engines key their caches by it
        device = self.device_for(served)
        refusal = package_refusal(
            folder, family, device, served.args, options=served.options, memory_budget_gib=served.memory_budget_gib
        )
        if refusal:
            raise ValueError(refusal)
        context = LoadContext(
            device=device,
            args=served.args,
            engines=self.engines,
            engine_choice=served.engine,
            threads=self.settings.threads,
            package_sha256=served.sha256,
            cache_dir=self.store.engine_cache,
            progress=self.progress,
            deterministic=self.settings.deterministic,
            prefer_invariant=never_coalesces(served.args.profile, served.args.enable_shared_context),
            options=served.options,
        )
        model = self.device_thread.call(family.load, folder, context)
        problems = surface_contract_problems(model)
        if problems:
            raise ValueError(f"the {family.name} family's model {'; '.join(problems)}")
        served.model = model
        profile, published = settled_profile(served.args, model, device)  # R-PROF-3, before it serves anything
        plugins = [self.families.info(family.name).card()]
        if model.engine.name in self.engines.names():
            plugins.append(self.engines.info(model.engine.name).card())
        limits = resolve_limits(served.args, device.kind, device.memory_total())
        served.serving = serving = Serving(tuple(plugins), limits, profile=profile, published=published)
        if isinstance(model, (MediaEmbedder, AudioEmbedder, MediaQuestionAnswerer)):
            if self.media is None:
                raise ValueError(f"the {family.name} family's model reads media, and this worker has no media loader")
            self.progress("load: starting the media decoders")
            self.media.start()
            served.serving = serving = serving.but(media=self.media)
        served.become(ModelState.WARMING)
        self.progress(f"load: warming {served.name}")
        self.device_thread.call(model.warm_up)
        invariant = self.device_thread.call(self.readiness.probe, model)  # R-BAT-5, before the scheduler exists
        if invariant is not None:
            served.serving = serving = serving.but(batch_invariant=invariant)
        if self.settings.deterministic:
            serving = self._make_deterministic(served.name, model, serving)
        forwards = self._forward_setup(served, model)
        served.serving = serving.but(forwards=forwards)
        assert self._loop is not None
        asyncio.run_coroutine_threadsafe(self._start_scheduler_loop(served), self._loop).result()
        passed = self._golden_check(served)
        self.device_thread.call(forwards.runner.golden_done, served.golden["status"])
        if not passed:
            return
        self._calibrate(served)
        served.become(ModelState.READY)
        self.progress(f"load: {served.name} ready ({model.family}, {', '.join(sorted(model.surfaces))})")

    def _make_deterministic(self, name: str, model: LoadedModel, serving: Serving) -> Serving:
        """`--deterministic` (`domain/worker/lifecycle` decides): merged forwards where the engine is
        batch-invariant and the probe agrees; one row per forward otherwise; refused when the
        engine cannot honour it. The serving record with the method and the limits it serves with."""
        method = decide_determinism(model.engine.name, model.engine.determinism, serving.batch_invariant)
        self.progress(f"load: {name} deterministic ({method})")
        limits = serving.limits
        if method is Determinism.ROWS_ALONE:
            limits = dataclasses.replace(limits, max_num_seqs=1, seqs_source="deterministic")
        return serving.but(determinism=method, limits=limits)

    def _forward_setup(self, served: ServedModel, model: LoadedModel) -> ForwardSetup:
        """How the model's forwards run (`forward_setup.py`), on its device, counting the device's
        forwards and the express thread's as busy."""
        assert self._loop is not None
        return forward_setup(
            served.name,
            model,
            self.device_for(served),
            self.settings,
            self.device_thread,
            thread_context=self.thread_context,
            metrics=self.metrics,
            clock=self.clock,
            loop=self._loop,
            busy=self._busy,
            progress=self.progress,
        )

    def _express_thread(self) -> DeviceThread:
        """The device's express threads (R-FAIR-7, R-BAT-6), made at their first use: as many forward
        threads as the device has slots (the lane express runs up to that many forwards at once; the
        tenant express one), at the event loop's priority, each declaring one forward's team like the
        others."""
        if self.express_thread is None:
            context, threads = self.thread_context, self.settings.threads
            declare = partial(context.declare, threads) if context is not None and threads is not None else None
            self.express_thread = DeviceThread("srun-express", workers=self.device_thread.workers, initializer=declare)
            self._busy.add(self.express_thread)
        return self.express_thread

    def _golden_check(self, served: ServedModel) -> bool:
        """R-GOLD-1: the recorded requests, twice, through the serving path. False: failed (final)."""
        assert self._loop is not None
        self.progress(f"load: golden check of {served.name}")
        served.golden = asyncio.run_coroutine_threadsafe(self.readiness.golden(served), self._loop).result()
        status, reason = served.golden["status"], served.golden["reason"]
        self.progress(f"load: {served.name} golden {status}" + (f" ({reason})" if reason else ""))
        if status == "failed":
            served.become(ModelState.FAILED, f"golden check failed: {reason}")
            return False
        return True

    def _calibrate(self, served: ServedModel) -> None:
        """R-DEV-2 on a GPU worker: time merged forwards, keep the knee; a set value stays."""
        model, serving = served.model, served.serving
        assert model is not None and serving is not None
        limits = serving.limits
        device = self.device_for(served)
        if self.calibrator is None or not self.calibrator.applies(device):
            return
        if limits.tokens_source == "set":
            served.serving = serving.but(calibration={"status": "skipped", "reason": "max_num_batched_tokens is set"})
            return
        self.progress(f"load: calibrating the token budget of {served.name} on {device.name}")
        try:
            found = self.device_thread.call(self.calibrator.calibrate, model, limits, device, self.progress)
        except Exception as exc:  # the golden check passed: the model serves on its class budget, the card says why
            if not isinstance(exc, CalibrationFailed):
                log.exception("calibration of %s failed", served.name)
            reason = str(exc) if isinstance(exc, CalibrationFailed) else f"{type(exc).__name__}: {exc}"
            reason = without_paths(reason)  # the card is public; the log keeps the paths
            served.serving = serving.but(calibration={"status": "failed", "reason": reason[:300]})
            self.progress(f"load: {served.name} keeps its class budget ({reason[:300]})")
            return
        served.serving = serving.but(limits=calibrated_limits(limits, found.tokens), calibration=found.card())
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
        loop.scheduler.set_budget(limits.budget)
        loop.scheduler.costs.seed(model.lanes[0].name, found.seconds_per_token)

    async def _start_scheduler_loop(self, served: ServedModel) -> None:
        model, serving = served.model, served.serving
        assert model is not None and serving is not None and serving.forwards is not None
        limits, forwards = serving.limits, serving.forwards
        # one row per forward (`--deterministic` rows alone, or a profile that never coalesces on a
        # model that is not batch-invariant, R-PROF-2): no company to wait for
        alone = serving.determinism is Determinism.ROWS_ALONE or runs_alone(served.profile, serving.batch_invariant)
        scheduler = Scheduler(
            model.lanes,
            limits.budget,
            window_s=0.0 if alone else served.args.batch_window_ms / 1000,
            batch_invariant=serving.batch_invariant,
            invariant_tokens=model.invariant_tokens or BATCH_INVARIANT_TOKENS,
            max_in_flight=forwards.concurrent_forwards,
            tenants=self.tenants,
        )

        served.scheduler_loop = SchedulerLoop(
            scheduler,
            forwards.runner.run,
            self.device_thread,
            clock=self.clock,
            on_forward=partial(self.metrics.observe_forward, served.name),
            express=self._express_thread() if forwards.express_forward else None,
            yield_gate=YieldGate() if forwards.lane_yield else None,
        )
        served.scheduler_loop.start()
        self.metrics.queue_depth.set_function(lambda: float(scheduler.queued_rows), {"model": served.name})
