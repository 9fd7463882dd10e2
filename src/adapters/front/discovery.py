"""Replicas found through DNS, at the front: one `DnsDiscovery` per `{dns: NAME, port: P}`
replica of a deployment resolves NAME every `resolve_every_ms` (default 5 s) and hands what
changed (`domain/fleet/discovery.plan_discovery`) to the fleet:

- a new address becomes an attached replica `SCHEME://ADDRESS:P` of the deployment (built by
  the workers factory, supervised like any endpoint replica: it takes requests once its `/health`
  answers and its card fits);
- a vanished address is drained: out of dispatch at once, its probes stopped, dropped once the
  requests it holds are answered (or its deployment's timeout passed);
- a failed (or empty) resolution keeps the last good set; the first failure of a streak is one
  warning line, the recovery one info line (`domain/fleet/discovery.ResolutionStreak`), and every
  failure counts in `vllm_sr_dns_resolution_failures_total{deployment}`.

Across reloads (`fleet.py`) the addresses a watcher serves are carried into the new config's
placement, so an unchanged deployment keeps its discovered workers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from vllm_srun.adapters.config.schema import ReplicaConfig
from vllm_srun.adapters.front.metrics import FrontEvents
from vllm_srun.adapters.workers.supervisor import DeploymentView, ReplicaSupervisor
from vllm_srun.domain.fleet.discovery import (
    DEFAULT_RESOLVE_EVERY_MS,
    AddressResolver,
    Announcement,
    DiscoveryChange,
    ResolutionFailed,
    ResolutionStreak,
    plan_discovery,
)

log = logging.getLogger("vllm_srun.front")


class DiscoveryHost(Protocol):
    """What a watcher asks of the fleet: add a replica at a placement, drain one."""

    def add_discovered(self, view: DeploymentView, placement: ReplicaConfig) -> ReplicaSupervisor | None: ...

    def drain_discovered(self, view: DeploymentView, supervisor: ReplicaSupervisor, reason: str) -> None: ...


class DnsDiscovery:
    def __init__(
        self,
        deployment: DeploymentView,
        entry: ReplicaConfig,
        resolver: AddressResolver,
        host: DiscoveryHost,
        events: FrontEvents,
        serving: dict[str, ReplicaSupervisor] | None = None,
    ) -> None:
        self.deployment = deployment
        self.entry = entry
        self.resolver = resolver
        self.host = host
        self.events = events
        self.serving: dict[str, ReplicaSupervisor] = dict(serving or {})  # address -> its worker
        self.streak = ResolutionStreak()
        self.last_error: str | None = None
        self._task: asyncio.Task[None] | None = None
        self.events.discovered(deployment.name, entry.dns or "", len(self.serving))

    @property
    def interval_s(self) -> float:
        return (self.entry.resolve_every_ms or DEFAULT_RESOLVE_EVERY_MS) / 1000.0

    def placement(self, address: str) -> ReplicaConfig:
        """The attached replica ADDRESS is."""
        host = f"[{address}]" if ":" in address else address
        return ReplicaConfig(
            endpoint=f"{self.entry.scheme or 'http'}://{host}:{self.entry.port}", model=self.entry.model
        )

    # ---- one resolution ------------------------------------------------------------------
    async def refresh(self) -> DiscoveryChange:
        """Resolve the name once and apply what changed."""
        name = self.entry.dns or ""
        try:
            resolved: list[str] | None = await self.resolver.resolve(name)
            error = None if resolved else f"{name}: no address"
        except ResolutionFailed as exc:
            resolved, error = None, str(exc)
        change = plan_discovery(self.serving, resolved)
        failures_before = self.streak.failures_in_a_row
        self.streak, announcement = self.streak.after(not change.failed)
        if change.failed:
            self.last_error = error
            self.events.dns_failed(self.deployment.name)
        if announcement is Announcement.FAILING:
            log.warning(
                "dns_resolution_failing deployment=%s name=%s error=%s; keeping the last good set (%d replicas)",
                self.deployment.name,
                name,
                error,
                len(self.serving),
            )
        elif announcement is Announcement.RECOVERED:
            log.info(
                "dns_resolution_recovered deployment=%s name=%s after=%d failures",
                self.deployment.name,
                name,
                failures_before,
            )
            self.last_error = None
        for address in change.drained:
            supervisor = self.serving.pop(address)
            self.host.drain_discovered(self.deployment, supervisor, f"{name} no longer resolves to {address}")
        for address in change.added:
            added = self.host.add_discovered(self.deployment, self.placement(address))
            if added is not None:
                self.serving[address] = added
        if change.added or change.drained:
            log.info(
                "dns_replicas_changed deployment=%s name=%s added=%s drained=%s serving=%d",
                self.deployment.name,
                name,
                ",".join(change.added) or "-",
                ",".join(change.drained) or "-",
                len(self.serving),
            )
        self.events.discovered(self.deployment.name, name, len(self.serving))
        return change

    # ---- the loop ------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception:  # a bug in one refresh must not end discovery
                log.exception("dns discovery of %s in %s failed", self.entry.dns, self.deployment.name)
            await asyncio.sleep(self.interval_s)

    def cancel(self) -> None:
        """Stop resolving (its deployment was replaced or the front stops); its workers stay."""
        if self._task is not None:
            self._task.cancel()
            self._task = None


Resolvers = Callable[[str | None], AddressResolver]  # a replica's `nameserver` -> its resolver
