"""The front's deployments: for each, its pool (domain), its replicas' handles and supervisors,
its reference card and (single-worker deployments only) a front result cache (R-PERF-3).

Building a fleet starts nothing; it raises ConfigError (one line per problem) when a managed
worker would refuse its settings. `start()` starts every worker and the ejection clock.

Reconfiguration (R-REP-2, `reconfigure.py`): `plan(config)` builds the new deployments from
the pure plan of `domain/reconfiguration` (which workers are kept, started, retired; whether the
reference card and front cache carry over), the new workers built by `workers/factory.py`;
`publish(config, plans)` swaps them in at once and returns the retired workers, which
`retire()` stops once they hold no request. Names resolve through `domain/lifecycle`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_srun.adapters.config.schema import (
    ConfigError,
    DeploymentConfig,
    FrontConfig,
    ReplicaConfig,
)
from vllm_srun.adapters.front.metrics import FrontEvents
from vllm_srun.adapters.schemas.models_list import TYPESAFE_DEFAULT_MODEL, is_decision_card
from vllm_srun.adapters.workers.factory import WorkerFactory
from vllm_srun.adapters.workers.replica import ReplicaHandle
from vllm_srun.adapters.workers.supervisor import ReplicaSupervisor
from vllm_srun.domain import bounds
from vllm_srun.domain.cache import LruCache
from vllm_srun.domain.dispatch import Pool
from vllm_srun.domain.ejection import PoolEvent, ProbeHealth
from vllm_srun.domain.errors import InvalidRequest, ModelNotFound, quoted
from vllm_srun.domain.lifecycle import NameTable, Unresolved, name_table, sole
from vllm_srun.domain.reconfiguration import CachePlan, Deployed, DeploymentChange, Wanted, plan_reconfiguration

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
        tenant_policies: str | None = None,  # the front's key file, for its managed workers (R-FAIR-1)
    ) -> None:
        self.events = events
        self.clock = clock
        self.workers = WorkerFactory(
            socket_dir=socket_dir,
            threads=threads,
            max_request_bytes=max_request_bytes,
            worker_log_level=worker_log_level,
            env=env,
            clock=clock,
            tenant_policies=tenant_policies,
            on_event=lambda event, h, detail: events.lifecycle(event, h.deployment, h.id, detail),
        )
        self.config = config
        self.deployments: dict[str, Deployment] = {}
        self.retiring: dict[str, ReplicaSupervisor] = {}  # retired workers finishing what they hold
        self.preparing: list[ReplicaSupervisor] = []  # started by a reconfiguration, not published yet
        self._names = NameTable(())
        self._tick_task: asyncio.Task[None] | None = None
        self.publish(config, self.plan(config))  # ConfigError: a worker would refuse its settings

    # ---- plans (R-REP-2: reconfiguration) ------------------------------------------------
    def plan(self, config: FrontConfig) -> dict[str, DeploymentPlan]:
        """The deployments of CONFIG, keeping every current worker whose deployment and
        placement are unchanged (`domain/reconfiguration` decides); builds the new workers
        (`workers/factory`) and starts nothing. Raises ConfigError (one line per problem) when a
        new managed worker would refuse its settings."""
        key = self.workers.key
        placements = {name: spec.placement() for name, spec in config.deployments.items()}
        current = {
            name: Deployed(
                d.config, tuple((s, key(d.config, s.handle.placement)) for s in d.supervisors), d.cache is not None
            )
            for name, d in self.deployments.items()
        }
        wanted = {
            name: Wanted(spec, tuple(key(spec, replica) for replica in placements[name]))
            for name, spec in config.deployments.items()
        }
        change = plan_reconfiguration(current, wanted)
        problems: list[str] = []
        plans = {
            name: self._apply(name, spec, placements[name], change.changes[name], problems)
            for name, spec in config.deployments.items()
        }
        if problems:
            raise ConfigError(list(dict.fromkeys(problems)))
        return plans

    def _apply(
        self,
        name: str,
        spec: DeploymentConfig,
        placement: list[ReplicaConfig],
        change: DeploymentChange[ReplicaSupervisor],
        problems: list[str],
    ) -> DeploymentPlan:
        """The Deployment a planned CHANGE gives, with the workers it starts built (not started)."""
        current = self.deployments.get(name)
        kept = list(change.kept)
        if change.unchanged and current is not None:
            return DeploymentPlan(current, [], kept)  # nothing changed: the same deployment
        pool = Pool(outlier_detection=spec.outlier_policy())
        deployment = Deployment(name=name, config=spec, pool=pool, handles={})
        if change.keeps_reference and current is not None:
            deployment.reference_card = current.reference_card
        started = []
        for replica, supervisor in zip(placement, change.match.kept):
            if supervisor is None:
                supervisor = self.workers.build(deployment, replica, pool, problems)
                started.append(supervisor)
            else:
                pool.add(supervisor.handle.record)
            deployment.handles[supervisor.handle.id] = supervisor.handle
            deployment.supervisors.append(supervisor)
        if change.cache is CachePlan.KEEP and current is not None:
            deployment.cache = current.cache
        elif change.cache is CachePlan.NEW:
            deployment.cache = _front_cache(spec)
        return DeploymentPlan(deployment, started, kept)

    def publish(self, config: FrontConfig, plans: dict[str, DeploymentPlan]) -> list[ReplicaSupervisor]:
        """Make CONFIG's deployments the served ones, at once; the workers no deployment keeps
        (retired: the caller lets them finish what they hold, then stops them)."""
        before = [s for d in self.deployments.values() for s in d.supervisors]
        self.config = config
        self.deployments = {name: plan.deployment for name, plan in plans.items()}
        self._names = _name_table(config)
        for plan in plans.values():
            for supervisor in plan.deployment.supervisors:
                supervisor.deployment = plan.deployment
                if supervisor in self.preparing:
                    self.preparing.remove(supervisor)
        serving = {id(s) for d in self.deployments.values() for s in d.supervisors}
        return [s for s in before if id(s) not in serving]

    # ---- lookup --------------------------------------------------------------------------
    def resolve(self, model: str | None) -> Deployment:
        """The deployment MODEL names (`domain/lifecycle`: names): its name, its artifact or the
        artifact's last part (when no other deployment has it), the typesafe-sdk's default."""
        found = self._names.resolve(model, self._implied)
        if found is Unresolved.UNNAMED:
            raise InvalidRequest(f"several deployments are served ({', '.join(self.deployments)}): name one in `model`")
        if found is Unresolved.UNKNOWN:
            raise ModelNotFound(
                f"model {quoted(model)} is not served here (deployments: {', '.join(self.deployments)})"
            )
        return self.deployments[found]

    def _implied(self, model: str) -> str | None:
        """The deployment the typesafe-sdk's default name means: `system.decision_model`, else
        the only one serving decisions, else the only one."""
        if model != TYPESAFE_DEFAULT_MODEL:
            return None
        named = self.config.system.decision_model.deployment
        if named is not None:
            return named
        cards = [d for d in self.deployments.values() if d.reference_card and is_decision_card(d.reference_card)]
        if len(cards) == 1:
            return cards[0].name
        return sole(self.deployments)

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


def _name_table(config: FrontConfig) -> NameTable:
    """Deployment names, and their artifacts (whole and last part) as aliases: an alias two
    deployments share names neither."""
    entries = [(name, (spec.artifact, Path(spec.artifact).name)) for name, spec in config.deployments.items()]
    return name_table(entries, first_wins=False)
