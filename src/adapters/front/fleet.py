"""The front's deployments: for each, its pool (domain), its replicas' handles and supervisors,
its reference card and (single-worker deployments only) a front result cache (R-PERF-3).

Building a fleet starts nothing; it raises ConfigError (one line per problem) when a managed
worker would refuse its settings. `start()` starts every worker and the ejection clock.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from vllm_srun.adapters.config.schema import (
    ConfigError,
    DeploymentConfig,
    FrontConfig,
    ReplicaConfig,
)
from vllm_srun.adapters.front.metrics import FrontEvents
from vllm_srun.adapters.workers.command import (
    is_cpu_device,
    worker_command,
    worker_settings,
)
from vllm_srun.adapters.workers.http_client import WorkerClient
from vllm_srun.adapters.workers.replica import ReplicaHandle
from vllm_srun.adapters.workers.supervisor import ReplicaSupervisor
from vllm_srun.domain import bounds
from vllm_srun.domain.cache import LruCache
from vllm_srun.domain.dispatch import Pool
from vllm_srun.domain.ejection import PoolEvent, ProbeHealth
from vllm_srun.domain.errors import InvalidRequest, ModelNotFound
from vllm_srun.domain.replicas import Replica

TICK_S = 0.25


@dataclass
class Deployment:
    name: str
    config: DeploymentConfig
    pool: Pool
    handles: dict[str, ReplicaHandle]
    reference_card: dict[str, Any] | None = None
    cache: LruCache[bytes] | None = None
    supervisors: list[ReplicaSupervisor] = field(default_factory=list)

    @property
    def timeout_s(self) -> float:
        return (self.config.timeout_ms or bounds.TIMEOUT_MS.default) / 1000.0

    def ready_count(self) -> int:
        return self.pool.ready_count()


class Fleet:
    def __init__(
        self,
        config: FrontConfig,
        *,
        socket_dir: str,
        threads: int | None,
        max_request_bytes: int | None = None,
        events: FrontEvents,
        worker_log_level: str = "warning",
        env: dict[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.events = events
        self.clock = clock
        self.deployments: dict[str, Deployment] = {}
        self._aliases: dict[str, str | None] = {}
        self._tick_task: asyncio.Task[None] | None = None
        count = 0
        problems: list[str] = []
        for name, spec in config.deployments.items():
            pool = Pool(outlier_detection=spec.outlier_policy())
            deployment = Deployment(name=name, config=spec, pool=pool, handles={})
            placement = spec.placement()
            for index, replica in enumerate(placement):
                handle = self._handle(name, index, replica, pool, socket_dir, count, threads)
                count += 1
                deployment.handles[handle.id] = handle
                command = None
                if not replica.attached:
                    settings = worker_settings(
                        spec,
                        device=replica.device or "auto",
                        uds=handle.socket_path or "",
                        threads=handle.threads,
                        max_request_bytes=max_request_bytes,
                        log_level=worker_log_level,
                    )
                    problems += [f"deployments.{name}: {problem}" for problem in settings.problems()]
                    command = worker_command(settings)
                deployment.supervisors.append(
                    ReplicaSupervisor(
                        handle,
                        deployment,
                        command=command,
                        env=env,
                        clock=clock,
                        on_event=lambda event, h, detail: events.lifecycle(event, h.deployment, h.id, detail),
                    )
                )
            if len(placement) == 1:
                entries = spec.result_cache_entries
                deployment.cache = LruCache(
                    bounds.RESULT_CACHE_ENTRIES.default if entries is None else entries,
                    max_weight=bounds.RESULT_CACHE_BYTES,
                    max_entry_weight=bounds.RESULT_CACHE_BYTES // 8,
                )
            self.deployments[name] = deployment
            for alias in {spec.artifact, Path(spec.artifact).name}:
                if alias and alias not in config.deployments:
                    self._aliases[alias] = None if alias in self._aliases else name  # None: ambiguous
        if problems:  # a managed worker would refuse its settings: stop before any starts
            raise ConfigError(list(dict.fromkeys(problems)))

    @staticmethod
    def _handle(
        deployment: str,
        index: int,
        replica: ReplicaConfig,
        pool: Pool,
        socket_dir: str,
        n: int,
        threads: int | None,
    ) -> ReplicaHandle:
        replica_id = f"{deployment}/{index}"
        record = pool.add(Replica(replica_id))
        if replica.attached:
            url = urlsplit(replica.endpoint or "")
            port = url.port or (443 if url.scheme == "https" else 80)
            client = WorkerClient(host=url.hostname, port=port, base_path=url.path, tls=url.scheme == "https")
            return ReplicaHandle(replica_id, deployment, replica, record, client, worker_model=replica.model)
        path = os.path.join(socket_dir, f"w{n}.sock")
        cpu = is_cpu_device(replica.device or "auto")
        return ReplicaHandle(
            replica_id,
            deployment,
            replica,
            record,
            WorkerClient(uds=path),
            socket_path=path,
            threads=threads if cpu else None,
        )

    # ---- lookup --------------------------------------------------------------------------
    def resolve(self, model: str | None) -> Deployment:
        if model is None:
            if len(self.deployments) == 1:
                return next(iter(self.deployments.values()))
            raise InvalidRequest(f"several deployments are served ({', '.join(self.deployments)}): name one in `model`")
        found = self.deployments.get(model)
        if found is not None:
            return found
        alias = self._aliases.get(model)
        if alias is not None:
            return self.deployments[alias]
        raise ModelNotFound(f"model {model!r} is not served here (deployments: {', '.join(self.deployments)})")

    # ---- events --------------------------------------------------------------------------
    def pool_events(self, deployment: Deployment, events: list[PoolEvent]) -> None:
        for event in events:
            self.events.pool_event(deployment.name, event)
            if isinstance(event, ProbeHealth):
                handle = deployment.handles.get(event.replica)
                if handle is not None:
                    handle.probe_now()

    # ---- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        for deployment in self.deployments.values():
            for supervisor in deployment.supervisors:
                supervisor.start()
        self._tick_task = asyncio.ensure_future(self._tick())

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            now = self.clock()
            for deployment in self.deployments.values():
                self.pool_events(deployment, deployment.pool.tick(now))

    async def stop(self, grace_s: float = 10.0) -> None:
        if self._tick_task is not None:
            self._tick_task.cancel()
        supervisors = [s for d in self.deployments.values() for s in d.supervisors]
        await asyncio.gather(*(s.stop(grace_s) for s in supervisors), return_exceptions=True)

    def in_flight(self) -> int:
        return sum(replica.in_flight for d in self.deployments.values() for replica in d.pool)

    def all_handles(self) -> list[ReplicaHandle]:
        return [h for d in self.deployments.values() for h in d.handles.values()]
