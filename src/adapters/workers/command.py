"""The command line of one managed worker: `vllm-srun serve ARTIFACT --uds SOCKET [engine
args] --threads N` (R-REP-1, R-ARG, R-CPU-1). Only the arguments the deployment sets are
passed, so every unset one keeps the worker's default.
"""

from __future__ import annotations

import sys

from vllm_srun.adapters.config.schema import DeploymentConfig

WORKER_MODULE = "vllm_srun.app.cli"
REQUEST_BYTES_SLACK = 64 * 1024  # the front may lengthen `model` when it rewrites a body

_VALUE_FLAGS = (
    ("max_num_seqs", "--max-num-seqs"),
    ("max_num_batched_tokens", "--max-num-batched-tokens"),
    ("batch_window_ms", "--batch-window-ms"),
    ("dtype", "--dtype"),
    ("max_model_len", "--max-model-len"),
    ("result_cache_entries", "--result-cache-entries"),
    ("engine", "--engine"),
)


def is_cpu_device(device: str) -> bool:
    """A worker whose forwards run on the CPU (`auto` resolves to the CPU in the worker)."""
    return device in ("cpu", "auto")


def worker_args(
    deployment: DeploymentConfig,
    *,
    device: str,
    uds: str,
    threads: int | None,
    max_request_bytes: int | None = None,
    log_level: str = "warning",
) -> list[str]:
    """The `vllm-srun` arguments (after the program name) of one managed replica."""
    args = ["serve", deployment.artifact, "--uds", uds, "--device", device, "--log-level", log_level]
    for field, flag in _VALUE_FLAGS:
        value = getattr(deployment, field)
        if value is not None:
            args += [flag, _show(value)]
    if deployment.enable_shared_context is not None:
        args.append(
            "--enable-shared-context" if deployment.enable_shared_context else "--no-enable-shared-context"
        )
    if threads is not None and is_cpu_device(device):
        args += ["--threads", str(threads)]
    if max_request_bytes is not None:
        args += ["--max-request-bytes", str(max_request_bytes + REQUEST_BYTES_SLACK)]
    return args


def worker_command(args: list[str]) -> list[str]:
    return [sys.executable, "-m", WORKER_MODULE, *args]


def _show(value: object) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
