"""Which workers a reconfiguration keeps, starts and retires (R-REP-2).

A deployment's workers are described by keys: everything that decides what a worker is (its
command line for a managed worker: artifact, engine arguments, device…; its endpoint and
model for an attached one). A new config lists the keys it wants, in placement order. A
worker whose key is wanted again keeps its identity (no restart); a wanted key with no such
worker left is started new; a worker whose key is no longer wanted is retired (it finishes
what it holds, then stops). Equal keys pair up in declared order, so resizing a placement
keeps its first workers.

Pure: keys are opaque hashables.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
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
