"""Which workers a reconfiguration keeps, starts and retires (R-REP-2).

A deployment's workers are described by keys: everything that decides what a worker is (its
command line for a managed worker: artifact, engine arguments, device…; its endpoint and
model for an attached one). A new config lists the keys it wants, in placement order. A
worker whose key is wanted again keeps its identity (no restart); a wanted key with no such
worker left is started new; a worker whose key is no longer wanted is retired (it finishes
what it holds, then stops). Equal keys pair up in declared order, so resizing a placement
keeps its first workers.

A whole config is planned the same way (`plan_reconfiguration`): per deployment it wants, the
workers kept, started and retired, whether the deployment is unchanged (kept as it is), whether
its reference card and front cache carry over; the current deployments it no longer lists retire
all their workers. The front (`front/fleet.py`) builds the workers the plan starts.

Pure: keys are opaque hashables, configs are compared with ==.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

Id = TypeVar("Id")


@dataclass(frozen=True, slots=True)
class ReplicaMatch(Generic[Id]):
    kept: tuple[Id | None, ...]  # per wanted position: the worker kept there, or None (start one)
    retired: tuple[Id, ...]  # current workers no key wants, in their order

    @property
    def started(self) -> int:
        return sum(1 for kept in self.kept if kept is None)


def match_replicas(current: Sequence[tuple[Id, Hashable]], wanted: Sequence[Hashable]) -> ReplicaMatch[Id]:
    """Pair the current (id, key) workers with the wanted keys, first come first kept."""
    free: dict[Hashable, list[Id]] = {}
    for worker, key in current:
        free.setdefault(key, []).append(worker)
    kept: list[Id | None] = []
    for key in wanted:
        waiting = free.get(key)
        kept.append(waiting.pop(0) if waiting else None)
    taken = {worker for worker in kept if worker is not None}
    return ReplicaMatch(tuple(kept), tuple(worker for worker, _ in current if worker not in taken))


# ---- the plan of a whole config ---------------------------------------------------------------


class CachePlan(enum.Enum):
    """The front's result cache of a deployment (R-PERF-3: single-worker deployments only)."""

    NONE = "none"  # several workers: no front cache
    KEEP = "keep"  # the same single worker stays: its answers, so the cache of them, stay
    NEW = "new"  # a single worker that is new (or had no cache): an empty cache


@dataclass(frozen=True, slots=True)
class Deployed(Generic[Id]):
    """A deployment as it serves now: its config (compared with ==), its workers (id, key) in
    placement order, and whether it holds a front cache."""

    config: object
    workers: tuple[tuple[Id, Hashable], ...]
    has_cache: bool = False


@dataclass(frozen=True, slots=True)
class Wanted:
    """A deployment as a new config wants it: its config and its workers' keys, in placement order."""

    config: object
    keys: tuple[Hashable, ...]


@dataclass(frozen=True, slots=True)
class DeploymentChange(Generic[Id]):
    match: ReplicaMatch[Id]
    unchanged: bool  # same config, every worker kept in place: the deployment itself stays
    keeps_reference: bool  # a kept worker vouches for the current reference card
    cache: CachePlan

    @property
    def kept(self) -> tuple[Id, ...]:
        return tuple(worker for worker in self.match.kept if worker is not None)


@dataclass(frozen=True, slots=True)
class Reconfiguration(Generic[Id]):
    """What a new config does: per wanted deployment (in its order) the change, and the current
    deployments it no longer lists (every worker of those retires)."""

    changes: Mapping[str, DeploymentChange[Id]]
    removed: Mapping[str, tuple[Id, ...]]

    @property
    def added(self) -> tuple[str, ...]:
        """Deployments with no worker kept from before (new names, or every worker replaced)."""
        return tuple(name for name, change in self.changes.items() if not change.kept)

    @property
    def retired(self) -> tuple[Id, ...]:
        """Every current worker the new config does not keep: changed deployments' first."""
        retired = [worker for change in self.changes.values() for worker in change.match.retired]
        return (*retired, *(worker for workers in self.removed.values() for worker in workers))

    @property
    def started(self) -> int:
        return sum(change.match.started for change in self.changes.values())


def plan_deployment(current: Deployed[Id] | None, wanted: Wanted) -> DeploymentChange[Id]:
    """How one deployment goes from CURRENT (None: it is new) to WANTED."""
    now = current.workers if current is not None else ()
    match = match_replicas(now, wanted.keys)
    kept = sum(1 for worker in match.kept if worker is not None)
    unchanged = current is not None and wanted.config == current.config and kept == len(now) == len(wanted.keys)
    if len(wanted.keys) != 1:
        cache = CachePlan.NONE
    elif current is not None and current.has_cache and kept == 1:
        cache = CachePlan.KEEP
    else:
        cache = CachePlan.NEW
    return DeploymentChange(match, unchanged, keeps_reference=kept > 0 and current is not None, cache=cache)


def plan_reconfiguration(current: Mapping[str, Deployed[Id]], wanted: Mapping[str, Wanted]) -> Reconfiguration[Id]:
    """The plan from the CURRENT deployments to the WANTED ones (R-REP-2); starts nothing."""
    changes = {name: plan_deployment(current.get(name), spec) for name, spec in wanted.items()}
    removed = {
        name: tuple(worker for worker, _ in deployed.workers)
        for name, deployed in current.items()
        if name not in wanted
    }
    return Reconfiguration(changes, removed)
