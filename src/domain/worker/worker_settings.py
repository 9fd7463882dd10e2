"""What a worker's runtime is told (R-ARG, R-ADM-1, R-CPU-1): each model it serves (`ModelSpec`:
its artifact, engine args, served name, device, admission limits and engine) and the worker-wide
settings every model takes (`RuntimeSettings`).

The settings themselves (flags, models file entries, a deployment's fields, the worker's command
line) are one record declared in `adapters/config/` (`settings.WorkerSettings`), converted to this spec in
`adapters/config/domain_values.py`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vllm_srun.domain.scheduling.admission import AdmissionLimits
from vllm_srun.domain.settings import bounds
from vllm_srun.domain.settings.engine_args import EngineArgs
from vllm_srun.domain.worker.adaptive_threads import Mode
from vllm_srun.domain.worker.load_retries import LoadRetryPolicy


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One model a worker serves: its artifact and engine args, and what a models file entry
    (`--models FILE`) may set besides: the served name, the device, the admission limits and the
    engine. None: the worker's (the folder name, `--device`, `--max-queue`/`--max-queued-tokens`).
    A Hub id's revision (`ORG/NAME@REV`, `--revision`) is held apart from its artifact (`ORG/NAME`),
    and `target` joins them again for the model store."""

    artifact: str
    args: EngineArgs = field(default_factory=EngineArgs)
    name: str | None = None
    device: str | None = None
    admission: AdmissionLimits | None = None
    engine: str | None = None  # auto or a plugin's name (checked against the registry); None: the worker's
    # what a models file entry may add (upstream's fields): the Hub commit of a Hub id, the family
    # that must read the package (None: detected), the most GiB its weights may hold at the
    # precision it computes in, and its family's options
    revision: str | None = None
    family: str | None = None
    memory_budget_gib: float | None = None
    options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def served_name(self) -> str:
        """The name requests use: `name`, else the artifact's last path part (a Hub id's NAME)."""
        if self.name:
            return self.name
        return self.artifact.rstrip("/").rsplit("/", 1)[-1] or self.artifact

    @property
    def target(self) -> str:
        """What the model store resolves: the artifact, at its revision when it has one."""
        return f"{self.artifact}@{self.revision}" if self.revision else self.artifact


DEFAULT_ADMISSION = AdmissionLimits(bounds.MAX_QUEUE.default, bounds.MAX_QUEUED_TOKENS.default)


@dataclass(frozen=True, slots=True)
class RuntimeSettings:
    """The runtime's settings besides its adapters: the models, the engine a model takes unless its
    spec names one, the CPU threads one forward declares (THREADS; None: the engine's own count)
    within the worker's CPU budget (THREAD_BUDGET), the adaptive-threads mode, the OpenMP wait
    policy, `--deterministic`, the admission limits a model takes unless its spec sets its own, and
    the most tokens one request's rows may hold, and how a model that failed to load is tried
    again (R-LOAD-1). `bootstrap_worker` derives it from the settings record (and the CPU plan) in
    one place."""

    models: tuple[ModelSpec, ...] = ()
    engine: str = bounds.ENGINE.default
    threads: int | None = None
    thread_budget: int | None = None
    adaptive_threads: Mode = Mode.OFF
    wait_policy: str | None = None
    deterministic: bool = False
    admission: AdmissionLimits = DEFAULT_ADMISSION
    max_request_tokens: int = bounds.MAX_REQUEST_TOKENS.default
    load_retry: LoadRetryPolicy = field(default_factory=LoadRetryPolicy)

    def __post_init__(self) -> None:
        if self.deterministic and self.adaptive_threads is Mode.SERVE:
            raise ValueError("--deterministic serves every forward at one thread count: adaptive mode 2 cannot apply")
