"""What one `vllm-srun serve` process is told: the models, where it listens, its device and
engine, its engine arguments and its limits (R-ARG, R-REP-1, R-CPU-1).

The worker CLI parses its argv into a `WorkerSettings`; the front builds one per managed
worker and renders it with `to_argv()`, so neither side re-parses the other's command line.
`to_argv()` passes only what differs from the defaults of `bounds.py`, so every value left
out keeps the worker's default, and parsing its output gives the same settings back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm_srun.domain import bounds
from vllm_srun.domain.admission import AdmissionLimits
from vllm_srun.domain.connections import ConnectionLimits
from vllm_srun.domain.engine_args import EngineArgs


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One model a worker serves: its artifact and engine args, and what a models file entry
    (`--models FILE`) may set besides: the served name, the device and the admission limits.
    None: the worker's (the folder name, `--device`, `--max-queue`/`--max-queued-tokens`)."""

    artifact: str
    args: EngineArgs = field(default_factory=EngineArgs)
    name: str | None = None
    device: str | None = None
    admission: AdmissionLimits | None = None

    @property
    def served_name(self) -> str:
        """The name requests use: `name`, else the artifact's last path part."""
        if self.name:
            return self.name
        return self.artifact.rstrip("/").rsplit("/", 1)[-1] or self.artifact


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    models: tuple[str, ...] = ()  # none: the built-in default model (or the models file's)
    models_file: str | None = bounds.MODELS_FILE.default
    device: str = bounds.DEVICE.default
    engine: str = bounds.ENGINE.default  # auto or a plugin name; the CLIs check it is installed
    host: str = bounds.HOST.default
    port: int = bounds.PORT.default
    uds: str | None = bounds.UDS.default
    engine_args: EngineArgs = field(default_factory=EngineArgs)
    result_cache_entries: int = bounds.RESULT_CACHE_ENTRIES.default
    media_workers: int | None = bounds.MEDIA_WORKERS.default
    max_request_bytes: int = bounds.MAX_REQUEST_BYTES.default
    threads: int | None = bounds.THREADS.default
    concurrent_forwards: int | None = bounds.CONCURRENT_FORWARDS.default
    log_level: str = bounds.LOG_LEVEL.default
    deterministic: bool = bounds.DETERMINISTIC.default
    max_queue: int = bounds.MAX_QUEUE.default
    max_queued_tokens: int = bounds.MAX_QUEUED_TOKENS.default
    max_bundle_tasks: int = bounds.MAX_BUNDLE_TASKS.default
    max_request_tokens: int = bounds.MAX_REQUEST_TOKENS.default
    connections: ConnectionLimits = field(default_factory=ConnectionLimits)

    @property
    def admission(self) -> AdmissionLimits:
        return AdmissionLimits(self.max_queue, self.max_queued_tokens)

    def _valued(self) -> list[tuple[bounds.Setting[Any], object]]:
        """Every setting with its value, in the order `to_argv()` writes them."""
        args = self.engine_args
        return [
            (bounds.UDS, self.uds),
            (bounds.HOST, self.host),
            (bounds.PORT, self.port),
            (bounds.DEVICE, self.device),
            (bounds.LOG_LEVEL, self.log_level),
            (bounds.MAX_NUM_SEQS, args.max_num_seqs),
            (bounds.MAX_NUM_BATCHED_TOKENS, args.max_num_batched_tokens),
            (bounds.BATCH_WINDOW_MS, args.batch_window_ms),
            (bounds.DTYPE, args.dtype),
            (bounds.MAX_MODEL_LEN, args.max_model_len),
            (bounds.RESULT_CACHE_ENTRIES, self.result_cache_entries),
            (bounds.MEDIA_WORKERS, self.media_workers),
            (bounds.ENGINE, self.engine),
            (bounds.ENABLE_SHARED_CONTEXT, args.enable_shared_context),
            (bounds.THREADS, self.threads),
            (bounds.CONCURRENT_FORWARDS, self.concurrent_forwards),
            (bounds.MAX_REQUEST_BYTES, self.max_request_bytes),
            (bounds.DETERMINISTIC, self.deterministic),
            (bounds.MAX_QUEUE, self.max_queue),
            (bounds.MAX_QUEUED_TOKENS, self.max_queued_tokens),
            (bounds.MAX_BUNDLE_TASKS, self.max_bundle_tasks),
            (bounds.MODELS_FILE, self.models_file),
            (bounds.MAX_REQUEST_TOKENS, self.max_request_tokens),
            *self.connections.valued(),
        ]

    def problems(self) -> list[str]:
        """One line per value the worker would refuse (R-ARG-2); [] when it may start."""
        named = [
            f"model {model!r}: a model is named by a non-empty string that does not start with '-'"
            for model in self.models
            if model == "" or model.startswith("-")
        ]
        both = ["--models FILE is refused together with MODEL arguments"] if self.models and self.models_file else []
        return named + both + bounds.problems(self._valued())

    def to_argv(self) -> list[str]:
        """The `vllm-srun` arguments (after the program name): `serve MODEL… --flag=value…`."""
        argv = ["serve", *self.models]
        for setting, value in self._valued():
            if value == setting.default:
                continue
            if isinstance(setting, bounds.SwitchSetting):
                argv.append(setting.flag if value else setting.off_flag)
            else:
                argv.append(f"{setting.flag}={_spell(value)}")
        return argv


def _spell(value: object) -> str:
    """A value as its flag text; floats keep every digit, whole ones drop `.0`."""
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    return str(value)
