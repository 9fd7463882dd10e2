"""The command line of one managed worker (R-REP-1, R-ARG, R-CPU-1): the deployment's serving
settings (`model_args.ServingArgs`, which a deployment is) placed into a `WorkerSettings` record
and rendered by `WorkerSettings.to_argv()`. The record is canonical, so only what the deployment
sets differs from the worker's defaults, and every unset argument keeps the worker's default.

A deployment whose artifact is a Hugging Face id (`ORG/NAME`) and that names a `revision` gives
its workers `--revision`, so they resolve the same snapshot as the front's checks (R-PKG-5); the
revision of any other artifact only pins what the workers' cards report (`compat.py`).
"""

from __future__ import annotations

import sys
from pathlib import Path

from vllm_srun.adapters.config.schema import DeploymentConfig
from vllm_srun.adapters.config.settings import WorkerSettings
from vllm_srun.adapters.hub import parse_hub_id
from vllm_srun.domain.errors import ModelNotFound

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
    hub = hub_revision(deployment.artifact, deployment.revision)
    return WorkerSettings(
        **{name: getattr(serving, name) for name in serving.__struct_fields__},
        models=(deployment.artifact,),
        revision=hub,
        device=device,
        uds=uds,
        max_request_bytes=limit,
        threads=threads if is_cpu_device(device) else None,
        log_level=log_level,
        tenant_policies=tenant_policies,
    ).normalized()


def hub_revision(artifact: str, revision: str | None) -> str | None:
    """REVISION when ARTIFACT is a Hub id that names none itself (the worker's `--revision`), else None."""
    if revision is None or "@" in artifact or Path(artifact).expanduser().exists():
        return None
    try:
        return revision if parse_hub_id(artifact) is not None else None
    except ModelNotFound:  # pragma: no cover - only two revisions conflict, and ARTIFACT names none
        return None


def hub_target(artifact: str, revision: str | None) -> str:
    """What a deployment's workers resolve: a Hub id at the deployment's revision, else the artifact."""
    hub = hub_revision(artifact, revision)
    return f"{artifact}@{hub}" if hub is not None else artifact


def worker_command(settings: WorkerSettings) -> list[str]:
    return [sys.executable, "-m", WORKER_MODULE, *settings.to_argv()]
