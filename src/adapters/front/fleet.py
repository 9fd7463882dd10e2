"""The front's deployments: for each, its pool (domain), its replicas' handles and supervisors,
its reference card and (single-worker deployments only) a front result cache (R-PERF-3).

Building a fleet starts nothing; it raises ConfigError (one line per problem) when a managed
worker would refuse its settings. `start()` starts every worker and the ejection clock.

Reconfiguration (R-REP-2, `reconfigure.py`): `plan(config)` builds the new deployments,
keeping every worker whose deployment and placement did not change (`domain/reconfiguration`);
`publish(config, plans)` swaps them in at once and returns the retired workers, which
`retire()` stops once they hold no request.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Hashable
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
from vllm_srun.adapters.schemas.models_list import TYPESAFE_DEFAULT_MODEL, is_decision_card
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
from vllm_srun.domain.errors import InvalidRequest, ModelNotFound, quoted
from vllm_srun.domain.reconfiguration import match_replicas
from vllm_srun.domain.replicas import Replica
from vllm_srun.domain.worker_settings import WorkerSettings

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


@dataclass
class DeploymentPlan:
    """One deployment of a new config: the Deployment to publish, the workers it starts (not
    running yet) and the current workers it keeps."""

    deployment: Deployment
    started: list[ReplicaSupervisor]
    kept: list[ReplicaSupervisor]


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
        self.events = events
        self.clock = clock
        self.socket_dir = socket_dir
        self.threads = threads
        self.max_request_bytes = max_request_bytes
        self.worker_log_level = worker_log_level
        self.env = env
        self.config = config
        self.deployments: dict[str, Deployment] = {}
        self.retiring: dict[str, ReplicaSupervisor] = {}  # retired workers finishing what they hold
        self.preparing: list[ReplicaSupervisor] = []  # started by a reconfiguration, not published yet
        self._aliases: dict[str, str | None] = {}
        self._tick_task: asyncio.Task[None] | None = None
        self._sockets = 0
        self._next_index: dict[str, int] = {}
        self.publish(config, self.plan(config))  # ConfigError: a worker would refuse its settings

    # ---- plans (R-REP-2: reconfiguration) ------------------------------------------------
    def plan(self, config: FrontConfig) -> dict[str, DeploymentPlan]:
        """The deployments of CONFIG, keeping every current worker whose deployment and
        placement are unchanged; starts nothing. Raises ConfigError (one line per problem)
        when a new managed worker would refuse its settings."""
        problems: list[str] = []
        plans = {
            name: self._plan_deployment(name, spec, self.deployments.get(name), problems)
            for name, spec in config.deployments.items()
        }
        if problems:
            raise ConfigError(list(dict.fromkeys(problems)))
        return plans

    def _key(self, spec: DeploymentConfig, replica: ReplicaConfig) -> Hashable:
        """What decides a worker: its command (managed) or its endpoint (attached)."""
        if replica.attached:
            return ("attached", replica.endpoint, replica.model, spec.artifact, spec.revision)
        device = replica.device or "auto"
        return ("managed", self._settings(spec, device, ""), spec.revision)

    def _settings(self, spec: DeploymentConfig, device: str, uds: str) -> WorkerSettings:
        return worker_settings(
            spec,
            device=device,
            uds=uds,
            threads=self.threads if is_cpu_device(device) else None,
            max_request_bytes=self.max_request_bytes,
            log_level=self.worker_log_level,
        )

    def _plan_deployment(
        self, name: str, spec: DeploymentConfig, current: Deployment | None, problems: list[str]
    ) -> DeploymentPlan:
        placement = spec.placement()
        now = [(s, self._key(current.config, s.handle.placement)) for s in current.supervisors] if current else []
        match = match_replicas(now, [self._key(spec, replica) for replica in placement])
        kept = [s for s in match.kept if s is not None]
        if current is not None and spec == current.config and len(kept) == len(now) == len(placement):
            return DeploymentPlan(current, [], kept)  # nothing changed: the same deployment
        pool = Pool(outlier_detection=spec.outlier_policy())
        deployment = Deployment(name=name, config=spec, pool=pool, handles={})
        if kept and current is not None:
            deployment.reference_card = current.reference_card
        started = []
        for replica, supervisor in zip(placement, match.kept):
            if supervisor is None:
                supervisor = self._new_worker(deployment, replica, problems)
                started.append(supervisor)
            else:
                pool.add(supervisor.handle.record)
            deployment.handles[supervisor.handle.id] = supervisor.handle
            deployment.supervisors.append(supervisor)
        if len(placement) == 1:  # the same worker keeps its answers, so the front's cache of them stays
            same_worker = current is not None and current.cache is not None and len(kept) == 1
            deployment.cache = current.cache if same_worker and current is not None else _front_cache(spec)
        return DeploymentPlan(deployment, started, kept)

    def _new_worker(self, deployment: Deployment, replica: ReplicaConfig, problems: list[str]) -> ReplicaSupervisor:
        name = deployment.name
        index = self._next_index.get(name, 0)
        self._next_index[name] = index + 1
        handle = self._handle(name, index, replica, deployment.pool, self.socket_dir, self._sockets, self.threads)
        self._sockets += 1
        command = None
        if not replica.attached:
            settings = self._settings(deployment.config, replica.device or "auto", handle.socket_path or "")
            problems += [f"deployments.{name}: {problem}" for problem in settings.problems()]
            command = worker_command(settings)
        events = self.events
        return ReplicaSupervisor(
            handle,
            deployment,
            command=command,
            env=self.env,
            clock=self.clock,
            on_event=lambda event, h, detail: events.lifecycle(event, h.deployment, h.id, detail),
        )

    def publish(self, config: FrontConfig, plans: dict[str, DeploymentPlan]) -> list[ReplicaSupervisor]:
        """Make CONFIG's deployments the served ones, at once; the workers no deployment keeps
        (retired: the caller lets them finish what they hold, then stops them)."""
        before = [s for d in self.deployments.values() for s in d.supervisors]
        self.config = config
        self.deployments = {name: plan.deployment for name, plan in plans.items()}
        self._aliases = _aliases(config)
        for plan in plans.values():
            for supervisor in plan.deployment.supervisors:
                supervisor.deployment = plan.deployment
                if supervisor in self.preparing:
                    self.preparing.remove(supervisor)
        serving = {id(s) for d in self.deployments.values() for s in d.supervisors}
        return [s for s in before if id(s) not in serving]

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
        if model == TYPESAFE_DEFAULT_MODEL and (deciding := self._decision_deployment()) is not None:
            return deciding
        raise ModelNotFound(f"model {quoted(model)} is not served here (deployments: {', '.join(self.deployments)})")

    def _decision_deployment(self) -> Deployment | None:
        """The deployment the typesafe-sdk's default name means: `system.decision_model`, else
        the only one serving decisions, else the only one."""
        named = self.config.system.decision_model.deployment
        if named is not None:
            return self.deployments.get(named)
        cards = [d for d in self.deployments.values() if d.reference_card and is_decision_card(d.reference_card)]
        if len(cards) == 1:
            return cards[0]
        return next(iter(self.deployments.values())) if len(self.deployments) == 1 else None

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

    async def retire(self, supervisor: ReplicaSupervisor, wait_s: float) -> None:
        """Stop a retired worker once it holds no request (or after WAIT_S seconds)."""
        handle = supervisor.handle
        self.retiring[handle.id] = supervisor
        self.events.lifecycle("replica_retiring", handle.deployment, handle.id, f"in_flight={handle.record.in_flight}")
        deadline = self.clock() + wait_s
        try:
            while handle.record.in_flight > 0 and self.clock() < deadline:  # noqa: ASYNC110 - polls a count
                await asyncio.sleep(0.05)
            await supervisor.stop()
        finally:
            self.retiring.pop(handle.id, None)
        self.events.lifecycle("replica_retired", handle.deployment, handle.id, f"in_flight={handle.record.in_flight}")

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
        supervisors += [*self.preparing, *self.retiring.values()]
        await asyncio.gather(*(s.stop(grace_s) for s in supervisors), return_exceptions=True)

    def in_flight(self) -> int:
        return sum(replica.in_flight for d in self.deployments.values() for replica in d.pool)

    def all_handles(self) -> list[ReplicaHandle]:
        serving = [h for d in self.deployments.values() for h in d.handles.values()]
        return serving + [s.handle for s in (*self.preparing, *self.retiring.values())]


def _front_cache(spec: DeploymentConfig) -> LruCache[bytes]:
    """The front's result cache of a single-worker deployment (R-PERF-3)."""
    entries = spec.result_cache_entries
    return LruCache(
        bounds.RESULT_CACHE_ENTRIES.default if entries is None else entries,
        max_weight=bounds.RESULT_CACHE_BYTES,
        max_entry_weight=bounds.RESULT_CACHE_BYTES // 8,
    )


def _aliases(config: FrontConfig) -> dict[str, str | None]:
    """Artifact names that address a deployment (None: more than one has it)."""
    aliases: dict[str, str | None] = {}
    for name, spec in config.deployments.items():
        for alias in {spec.artifact, Path(spec.artifact).name}:
            if alias and alias not in config.deployments:
                aliases[alias] = None if alias in aliases else name
    return aliases
