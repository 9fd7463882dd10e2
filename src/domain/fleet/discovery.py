"""Replicas found through DNS (R-REP-2: membership changes while serving): what one resolution
of a name changes in the set of replicas it gives, and when a failing name is worth a log line.

A deployment's replica `{dns: NAME, port: P}` stands for every address NAME resolves to (all A
and AAAA records, as a Kubernetes headless Service gives). The front resolves NAME every few
seconds; each answer is compared with the addresses it serves from:

- an address that appears is *added*: a new attached replica is built for it, which takes
  requests once its `/health` answers (the supervisor's probes decide, like any replica);
- an address that vanished is *drained*: it takes no new request, and is dropped once the
  requests it holds are answered (or its deployment's timeout passed);
- a failed resolution, or an answer with no address, changes nothing: the last good set is
  kept (a DNS outage must not empty a deployment; a deployment that must shrink to nothing is
  removed from the config instead).

A failing name is said once: `ResolutionStreak` announces the first failure of a streak and the
first success after it, never every tick.

Pure: addresses are strings compared as given (the resolver spells them one way).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

DEFAULT_RESOLVE_EVERY_MS = 5000


class ResolutionFailed(Exception):
    """A name could not be resolved this time (the message says why, in one line)."""


class AddressResolver(Protocol):
    """The port a resolver implements: every address NAME has now (A and AAAA), or
    ResolutionFailed."""

    async def resolve(self, name: str) -> list[str]: ...


@dataclass(frozen=True, slots=True)
class DiscoveryChange:
    added: tuple[str, ...]  # addresses to build a replica for, sorted
    drained: tuple[str, ...]  # addresses whose replica stops taking requests, sorted
    kept: tuple[str, ...]  # addresses served before and after, sorted
    failed: bool = False  # the resolution failed or was empty: nothing changed


def plan_discovery(serving: Iterable[str], resolved: Iterable[str] | None) -> DiscoveryChange:
    """What one resolution changes: SERVING are the addresses served now, RESOLVED the
    addresses the name has (None: the resolution failed). A failed or empty resolution keeps
    every served address."""
    current = set(serving)
    answer = set(resolved) if resolved is not None else set()
    if not answer:
        return DiscoveryChange(added=(), drained=(), kept=tuple(sorted(current)), failed=True)
    return DiscoveryChange(
        added=tuple(sorted(answer - current)),
        drained=tuple(sorted(current - answer)),
        kept=tuple(sorted(current & answer)),
    )


class Announcement(enum.Enum):
    FAILING = "failing"  # the first failure after a success (or the first resolution)
    RECOVERED = "recovered"  # the first success after a failure


@dataclass(frozen=True, slots=True)
class ResolutionStreak:
    """Whether the name is failing now, and how many resolutions in a row failed."""

    failures_in_a_row: int = 0

    def after(self, succeeded: bool) -> tuple[ResolutionStreak, Announcement | None]:
        """The streak after one more resolution, and what is worth saying about it (once per
        change: a name that keeps failing is announced on its first failure only)."""
        if succeeded:
            return ResolutionStreak(0), (Announcement.RECOVERED if self.failures_in_a_row else None)
        return ResolutionStreak(self.failures_in_a_row + 1), (None if self.failures_in_a_row else Announcement.FAILING)


def drain_finished(in_flight: int, waited_s: float, limit_s: float) -> bool:
    """A drained replica is dropped once it holds no request, or once LIMIT_S (its deployment's
    timeout and a margin) passed: a request still held then has been answered 504 already."""
    return in_flight <= 0 or waited_s >= limit_s
