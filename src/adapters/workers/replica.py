"""What the front holds for one replica besides its domain record: how to reach it, the
process (managed replicas), its card, and its probe state."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from vllm_srun.adapters.config.schema import ReplicaConfig
from vllm_srun.adapters.workers.compat import calibrated_limits
from vllm_srun.adapters.workers.http_client import WorkerClient
from vllm_srun.adapters.workers.process import WorkerProcess
from vllm_srun.domain.fleet.replicas import Replica


@dataclass
class ReplicaHandle:
    id: str
    deployment: str
    placement: ReplicaConfig
    record: Replica
    client: WorkerClient
    worker_model: str | None = None  # the `model` the worker knows the deployment's model by
    process: WorkerProcess | None = None
    socket_path: str | None = None
    threads: int | None = None
    card: dict[str, Any] | None = None
    probe_failures: int = 0
    last_probe_error: str | None = None
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def attached(self) -> bool:
        return self.placement.attached

    def probe_now(self) -> None:
        """Ask the supervisor to probe /health at once (an outlier event asked for it)."""
        self.wake.set()

    def describe(self) -> dict[str, Any]:
        """Inventory fields beyond the domain status."""
        out: dict[str, Any] = {"kind": "attached" if self.attached else "managed"}
        if self.attached:
            out["endpoint"] = self.placement.endpoint
        else:
            out["device"] = self.placement.device or "auto"
            out["pid"] = self.process.pid if self.process is not None and self.process.running else None
            out["threads"] = self.threads
        out["model"] = self.worker_model
        out["limits"] = calibrated_limits(self.card)
        if self.last_probe_error is not None:
            out["last_probe_error"] = self.last_probe_error
        return out
