"""The command line of one managed worker (R-REP-1, R-ARG, R-CPU-1): the deployment's settings
as a `WorkerSettings`, rendered by `WorkerSettings.to_argv()`. Only what the deployment sets
differs from the worker's defaults, so every unset argument keeps the worker's default.
"""

from __future__ import annotations

import sys
from typing import TypeVar

from vllm_srun.adapters.config.schema import DeploymentConfig
from vllm_srun.domain.engine_args import EngineArgs
from vllm_srun.domain.worker_settings import WorkerSettings

WORKER_MODULE = "vllm_srun.app.cli"
REQUEST_BYTES_SLACK = 64 * 1024  # the front may lengthen `model` when it rewrites a body
T = TypeVar("T")


def is_cpu_device(device: str) -> bool:
    """A worker whose forwards may run on the CPU, so it gets a CPU thread budget (`auto` is the CPU
    unless the worker finds a GPU with room)."""
    return device in ("cpu", "auto")


def worker_settings(
    deployment: DeploymentConfig,
    *,
    device: str,
    uds: str,
    threads: int | None,
    max_request_bytes: int | None = None,
    log_level: str = "warning",
) -> WorkerSettings:
    """The settings of one managed replica of `deployment` on `device`."""
    defaults = WorkerSettings()
    args = EngineArgs(
        max_num_seqs=deployment.max_num_seqs,
        max_num_batched_tokens=deployment.max_num_batched_tokens,
        batch_window_ms=_or(deployment.batch_window_ms, defaults.engine_args.batch_window_ms),
        dtype=_or(deployment.dtype, defaults.engine_args.dtype),
        enable_shared_context=deployment.enable_shared_context,
        max_model_len=deployment.max_model_len,
    )
    return WorkerSettings(
        models=(deployment.artifact,),
        device=device,
        engine=_or(deployment.engine, defaults.engine),
        uds=uds,
        engine_args=args,
        result_cache_entries=_or(deployment.result_cache_entries, defaults.result_cache_entries),
        media_workers=deployment.media_workers,
        max_request_tokens=_or(deployment.max_request_tokens, defaults.max_request_tokens),
        max_queue=_or(deployment.max_queue, defaults.max_queue),
        max_queued_tokens=_or(deployment.max_queued_tokens, defaults.max_queued_tokens),
        max_request_bytes=(
            defaults.max_request_bytes if max_request_bytes is None else max_request_bytes + REQUEST_BYTES_SLACK
        ),
        threads=threads if is_cpu_device(device) else None,
        log_level=log_level,
    )


def worker_command(settings: WorkerSettings) -> list[str]:
    return [sys.executable, "-m", WORKER_MODULE, *settings.to_argv()]


def _or(value: T | None, default: T) -> T:
    return default if value is None else value
