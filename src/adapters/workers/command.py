"""The command line of one managed worker (R-REP-1, R-ARG, R-CPU-1): the deployment's serving
settings (`settings.ServingArgs`, which a deployment is) placed into a `WorkerSettings` record
and rendered by `WorkerSettings.to_argv()`. The record is canonical, so only what the deployment
sets differs from the worker's defaults, and every unset argument keeps the worker's default.
"""

from __future__ import annotations

import sys

from vllm_srun.adapters.config.schema import DeploymentConfig
from vllm_srun.adapters.config.settings import WorkerSettings

WORKER_MODULE = "vllm_srun.app.cli"
REQUEST_BYTES_SLACK = 64 * 1024  # the front may lengthen `model` when it rewrites a body


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
    tenant_policies: str | None = None,
) -> WorkerSettings:
    """The settings of one managed replica of `deployment` on `device`; TENANT_POLICIES: the
    front's key file, whose tenant policies the worker applies (a path: never a digest on argv)."""
    serving = deployment.serving_args()
    limit = WorkerSettings().max_request_bytes if max_request_bytes is None else max_request_bytes + REQUEST_BYTES_SLACK
    return WorkerSettings(
        **{name: getattr(serving, name) for name in serving.__struct_fields__},
        models=(deployment.artifact,),
        device=device,
        uds=uds,
        max_request_bytes=limit,
        threads=threads if is_cpu_device(device) else None,
        log_level=log_level,
        tenant_policies=tenant_policies,
    ).normalized()


def worker_command(settings: WorkerSettings) -> list[str]:
    return [sys.executable, "-m", WORKER_MODULE, *settings.to_argv()]
