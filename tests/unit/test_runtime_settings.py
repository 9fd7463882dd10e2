"""The runtime takes the settings record's worker-wide values through one derived value
(`RuntimeSettings`, derived by `bootstrap_worker`): what `vllm-srun serve` is told reaches every
served model (R-ARG, R-ADM-1, R-CPU-1), a models file entry's own values win, and a combination
the runtime cannot honour is refused before anything is built."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests.fakes import FakeDevice
from vllm_srun.adapters.config.settings import WorkerSettings
from vllm_srun.adapters.serving.runtime import Runtime
from vllm_srun.app.bootstrap import bootstrap_worker
from vllm_srun.domain.scheduling.admission import AdmissionLimits
from vllm_srun.domain.scheduling.read_pacing import FLOOR, floor_for
from vllm_srun.domain.worker.adaptive_threads import Mode
from vllm_srun.domain.worker.threads import CpuPlan
from vllm_srun.domain.worker.worker_settings import ModelSpec


@contextmanager
def runtime_of(settings: WorkerSettings, **keywords: Any) -> Iterator[Runtime]:
    """The runtime `bootstrap_worker` builds for SETTINGS on a fake CPU (nothing loads)."""
    runtime = bootstrap_worker(settings.normalized(), device=FakeDevice(), **keywords).runtime()
    try:
        yield runtime
    finally:
        asyncio.run(runtime.stop())


def test_the_records_worker_wide_settings_reach_every_served_model() -> None:
    settings = WorkerSettings(
        models=("first", "team/second"),
        engine="onnxruntime",
        max_queue=7,
        max_queued_tokens=900,
        max_request_tokens=1234,
        media_workers=0,
        threads=3,
    )
    with runtime_of(settings) as runtime:
        assert list(runtime.models) == ["first", "second"]
        for served in runtime.models.values():
            assert served.engine == "onnxruntime" and served.max_request_tokens == 1234
            assert served.admission is not None and served.admission.limits == AdmissionLimits(7, 900)
        assert runtime.settings.threads == 3 and runtime.settings.thread_budget is None


def test_a_models_file_entry_keeps_its_own_engine_and_admission_and_the_cpu_plan_sets_the_threads() -> None:
    own = ModelSpec("mine", name="own", engine="native", admission=AdmissionLimits(2, 50))
    specs = [own, ModelSpec("plain")]
    plan = CpuPlan(team=2, concurrent=1, cpu_budget=6, wait_policy=None, forward_nice=0)
    settings = WorkerSettings(engine="onnxruntime", max_queue=9, media_workers=0, threads=5)
    with runtime_of(settings, specs=specs, cpu=plan) as runtime:
        mine, plain = runtime.models["own"], runtime.models["plain"]
        assert (mine.engine, plain.engine) == ("native", "onnxruntime")
        assert mine.admission is not None and mine.admission.limits == AdmissionLimits(2, 50)
        assert plain.admission is not None and plain.admission.limits.max_queue == 9
        assert (runtime.settings.threads, runtime.settings.thread_budget) == (2, 6)  # the plan's, not --threads


def test_deterministic_with_adaptive_serving_is_refused_before_anything_is_built() -> None:
    with pytest.raises(ValueError, match="adaptive mode 2 cannot apply"):
        bootstrap_worker(WorkerSettings(deterministic=True, media_workers=0), adaptive_threads=Mode.SERVE)


def test_the_read_floor_stays_under_the_smallest_queue_limit() -> None:
    """R-FAIR-5: a flood is paced at FLOOR requests in progress, or at three quarters of the
    smallest `max_queue` of the models served when that is less, so that the flood and a light
    tenant stay within the limit (past it the flood is refused down to its weight's share)."""
    plain = WorkerSettings(media_workers=0)
    assert bootstrap_worker(plain, device=FakeDevice()).connection_guard().reads.pacing.floor == FLOOR == 48
    small = WorkerSettings(max_queue=16, media_workers=0)
    assert bootstrap_worker(small, device=FakeDevice()).connection_guard().reads.pacing.floor == 12
    specs = [ModelSpec("mine", admission=AdmissionLimits(8, 50)), ModelSpec("plain")]
    container = bootstrap_worker(plain, specs=specs, device=FakeDevice())
    assert container.connection_guard().reads.pacing.floor == 6
    assert [floor_for(n) for n in (1, 2, 64, 65, 10_000)] == [1, 1, 48, 48, 48]
