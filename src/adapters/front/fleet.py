"""The front's deployments: for each, its pool (domain), its replicas' handles and supervisors,
its reference card and (single-worker deployments only) a front result cache (R-PERF-3).

Building a fleet starts nothing; it raises ConfigError (one line per problem) when a managed
worker would refuse its settings. `start()` starts every worker and the ejection clock.

Reconfiguration (R-REP-2, `reconfigure.py`): `plan(config)` builds the new deployments from
the pure plan of `domain/fleet/reconfiguration` (which workers are kept, started, retired; whether the
reference card and front cache carry over), the new workers built by `workers/factory.py`;
`publish(config, plans)` swaps them in at once and returns the retired workers, which
`retire()` stops once they hold no request. Names resolve through `domain/worker/lifecycle`.

Replicas found through DNS (`{dns: NAME, port: P}`, `discovery.py`): each such replica of a
deployment has a watcher that adds a worker per new address (`add_discovered`) and drains the
worker of a vanished one (`drain_discovered`: out of dispatch at once, dropped once it holds no
request). A plan places the addresses a current watcher serves as endpoint replicas, so a reload
keeps them like any unchanged worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
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
from vllm_srun.adapters.front.discovery import DnsDiscovery, Resolvers
from vllm_srun.adapters.front.dns import resolver_for
from vllm_srun.adapters.front.metrics import FrontEvents
from vllm_srun.adapters.schemas.models_list import TYPESAFE_DEFAULT_MODEL, is_decision_card
from vllm_srun.adapters.workers.factory import WorkerFactory
from vllm_srun.adapters.workers.replica import ReplicaHandle
from vllm_srun.adapters.workers.supervisor import DeploymentView, ReplicaSupervisor
from vllm_srun.domain.errors import InvalidRequest, ModelNotFound, quoted
from vllm_srun.domain.fleet.discovery import drain_finished
from vllm_srun.domain.fleet.dispatch import Pool
from vllm_srun.domain.fleet.ejection import PoolEvent, ProbeHealth
from vllm_srun.domain.fleet.reconfiguration import CachePlan, Deployed, DeploymentChange, Wanted, plan_reconfiguration
from vllm_srun.domain.settings import bounds
from vllm_srun.domain.worker.cache import LruCache
from vllm_srun.domain.worker.lifecycle import NameTable, Unresolved, name_table, sole

TICK_S = 0.25
DRAIN_MARGIN_S = 5.0  # past the deployment's timeout, a drained worker is dropped anyway
DRAIN_POLL_S = 0.05

log = logging.getLogger("vllm_srun.front")
Origin = tuple[ReplicaConfig, str] | None  # the DNS replica and address a placement came from


@dataclass
class Deployment:
    name: str
    config: DeploymentConfig
    pool: Pool
    handles: dict[str, ReplicaHandle]
    reference_card: dict[str, Any] | None = None
    cache: LruCache[bytes] | None = None
    supervisors: list[ReplicaSupervisor] = field(default_factory=list)
    discovery: list[DnsDiscovery] = field(default_factory=list)  # one per `dns` replica

    @property
    def timeout_s(self) -> float:
        return (self.config.timeout_ms or bounds.TIMEOUT_MS.default) / 1000.0

    def ready_count(self) -> int:
        return self.pool.ready_count()

    @property
    def public_id(self) -> str:
        """The model id clients see for this deployment: its `public_name`, else its name."""
        return self.config.public_name or self.name

    def answered_as(self, worker_model: str | None) -> str | None:
        """The `model` a replica's answers carry: an attached runtime's WORKER_MODEL, else (a
        managed worker) its served name, the artifact's last part — needed only to rename it to a
        `public_name`; None leaves a managed worker's answers as they are."""
        if worker_model is not None or self.config.public_name is None:
            return worker_model
        return self.config.artifact.rstrip("/").rsplit("/", 1)[-1] or self.config.artifact


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
        resolvers: Resolvers = resolver_for,  # a `dns` replica's `nameserver` -> its resolver
    ) -> None:
        self.events = events
        self.resolvers = resolvers
        self._running = False
        self._drains: set[asyncio.Task[None]] = set()
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
        placement are unchanged (`domain/fleet/reconfiguration` decides); builds the new workers
        (`workers/factory`) and starts nothing. Raises ConfigError (one line per problem) when a
        new managed worker would refuse its settings."""
        key = self.workers.key
        expanded = {name: self._expand(name, spec) for name, spec in config.deployments.items()}
        placements = {name: [replica for replica, _ in entries] for name, entries in expanded.items()}
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
            name: self._apply(name, spec, expanded[name], change.changes[name], problems)
            for name, spec in config.deployments.items()
        }
        if problems:
            raise ConfigError(list(dict.fromkeys(problems)))
        return plans

    def _apply(
        self,
        name: str,
        spec: DeploymentConfig,
        placement: list[tuple[ReplicaConfig, Origin]],
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
        seeds: dict[ReplicaConfig, dict[str, ReplicaSupervisor]] = {}  # per `dns` replica: its addresses
        for (replica, origin), supervisor in zip(placement, change.match.kept):
            if supervisor is None:
                supervisor = self.workers.build(deployment, replica, pool, problems)
                started.append(supervisor)
            else:
                pool.add(supervisor.handle.record)
            deployment.handles[supervisor.handle.id] = supervisor.handle
            deployment.supervisors.append(supervisor)
            if origin is not None:
                seeds.setdefault(origin[0], {})[origin[1]] = supervisor
        deployment.discovery = [
            DnsDiscovery(deployment, entry, self.resolvers(entry.nameserver), self, self.events, seeds.get(entry))
            for entry in spec.placement()
            if entry.dns is not None
        ]
        if change.cache is CachePlan.KEEP and current is not None:
            deployment.cache = current.cache
        elif change.cache is CachePlan.NEW:
            deployment.cache = _front_cache(spec)
        return DeploymentPlan(deployment, started, kept)

    def publish(self, config: FrontConfig, plans: dict[str, DeploymentPlan]) -> list[ReplicaSupervisor]:
        """Make CONFIG's deployments the served ones, at once; the workers no deployment keeps
        (retired: the caller lets them finish what they hold, then stops them)."""
        before = [s for d in self.deployments.values() for s in d.supervisors]
        for old in self.deployments.values():
            if all(plan.deployment is not old for plan in plans.values()):
                for watcher in old.discovery:
                    watcher.cancel()
        self.config = config
        self.deployments = {name: plan.deployment for name, plan in plans.items()}
        self._names = _name_table(config)
        for plan in plans.values():
            for supervisor in plan.deployment.supervisors:
                supervisor.deployment = plan.deployment
                if supervisor in self.preparing:
                    self.preparing.remove(supervisor)
        if self._running:
            for deployment in self.deployments.values():
                for watcher in deployment.discovery:
                    watcher.start()
        serving = {id(s) for d in self.deployments.values() for s in d.supervisors}
        return [s for s in before if id(s) not in serving]

    # ---- replicas found through DNS (`discovery.py`) ---------------------------------------
    def _expand(self, name: str, spec: DeploymentConfig) -> list[tuple[ReplicaConfig, Origin]]:
        """SPEC's placement with each `dns` replica replaced by the endpoint replicas its
        current watcher (same entry, same deployment name) serves: a reload keeps them."""
        current = self.deployments.get(name)
        watchers = {w.entry: w for w in current.discovery} if current is not None else {}
        out: list[tuple[ReplicaConfig, Origin]] = []
        for replica in spec.placement():
            if replica.dns is None:
                out.append((replica, None))
                continue
            watcher = watchers.get(replica)
            if watcher is not None:
                out += [(watcher.placement(address), (replica, address)) for address in sorted(watcher.serving)]
        return out

    def add_discovered(self, view: DeploymentView, placement: ReplicaConfig) -> ReplicaSupervisor | None:
        """A new worker of a served deployment at PLACEMENT (an address its DNS name gave),
        started; None when the deployment is no longer served or the worker cannot be built."""
        deployment = self.deployments.get(view.name)
        if deployment is not view or deployment is None:
            return None
        problems: list[str] = []
        supervisor = self.workers.build(deployment, placement, deployment.pool, problems)
        if problems:
            deployment.pool.remove(supervisor.handle.id)
            log.warning("dns replica %s of %s not added: %s", placement.endpoint, view.name, "; ".join(problems))
            return None
        deployment.handles[supervisor.handle.id] = supervisor.handle
        deployment.supervisors.append(supervisor)
        self.events.lifecycle("replica_discovered", view.name, supervisor.handle.id, f"endpoint={placement.endpoint}")
        supervisor.start()
        return supervisor

    def drain_discovered(self, view: DeploymentView, supervisor: ReplicaSupervisor, reason: str) -> None:
        """Take SUPERVISOR's worker out of dispatch now; drop it once it holds no request."""
        supervisor.handle.record.mark_failed(f"draining: {reason}")  # never picked again
        task = asyncio.ensure_future(self._drain(view, supervisor, reason))
        self._drains.add(task)
        task.add_done_callback(self._drains.discard)

    async def _drain(self, view: DeploymentView, supervisor: ReplicaSupervisor, reason: str) -> None:
        handle, record = supervisor.handle, supervisor.handle.record
        self.events.lifecycle("replica_draining", view.name, handle.id, f"{reason}; in_flight={record.in_flight}")
        await supervisor.stop(0)  # probes end; the connections of its requests stay open
        record.mark_failed(f"draining: {reason}")  # a probe that was answering meanwhile does not revive it
        limit_s = (view.config.timeout_ms or bounds.TIMEOUT_MS.default) / 1000.0 + DRAIN_MARGIN_S
        began = self.clock()
        while not drain_finished(record.in_flight, self.clock() - began, limit_s):  # noqa: ASYNC110 - polls a count
            await asyncio.sleep(DRAIN_POLL_S)
        deployment = view if isinstance(view, Deployment) else None
        if deployment is not None:
            with contextlib.suppress(KeyError):
                deployment.pool.remove(handle.id)
            deployment.handles.pop(handle.id, None)
            if supervisor in deployment.supervisors:
                deployment.supervisors.remove(supervisor)
        self.events.lifecycle("replica_retired", view.name, handle.id, f"in_flight={record.in_flight}")

    # ---- lookup --------------------------------------------------------------------------
    def resolve(self, model: str | None) -> Deployment:
        """The deployment MODEL names (`domain/worker/lifecycle`: names): its name, its artifact or the
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
        named = self.config.decision_deployment
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
        self._running = True
        for deployment in self.deployments.values():
            for supervisor in deployment.supervisors:
                supervisor.start()
            for watcher in deployment.discovery:
                watcher.start()
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
        self._running = False
        for deployment in self.deployments.values():
            for watcher in deployment.discovery:
                watcher.cancel()
        for task in list(self._drains):
            task.cancel()
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
    """Deployment names, and their public names and artifacts (whole and last part) as aliases: an
    alias two deployments share names neither."""
    entries = [
        (name, tuple(a for a in (spec.public_name, spec.artifact, Path(spec.artifact).name) if a))
        for name, spec in config.deployments.items()
    ]
    return name_table(entries, first_wins=False)
