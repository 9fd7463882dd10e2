"""Whose next request is read now and whose waits unread (R-FAIR-5).

The scheduler orders rows fairly (R-FAIR-2) only once they are queued; before that, the event
loop reads, checks and parses every request in arrival order. Under a flood of small requests
the loop itself is the bottleneck, so another tenant's request waits behind the flood's to be
*read*: its client-side latency is many times its server-side time, and a `GET /health/live`
beside the flood waits too (bench/tenants.py; the figures: docs/performance.md).

So the HTTP layer asks this table, when a connection that a key bound to a tenant sends its next
request, whether that tenant is `paced`: true when at least two tenants are active (holding a
request, or having started one within `active_s`), the tenant holds at least `floor` requests
(enough to keep forwards full on its own) and more than its weight's share of the requests in
progress of the active tenants. A paced tenant's request is left unread (in the kernel: it costs
the loop nothing) until one of the tenant's own requests finishes and it is no longer paced; a
request of a tenant within its share, or under the floor, is read at once. A flood therefore
holds at most `floor` requests (or its share, when the others hold more) while another tenant
is active, and the loop stays free for the others.

Properties (tests/property/test_read_pacing.py): a tenant alone is never paced (one tenant is
served exactly as before); a tenant under the floor is never paced; when every active tenant
holds work, one of them is within its share (shares sum to one); a paced tenant always holds a
request, so a finish comes that lets its next one be read (`adapters/http/read_pacing.py`).

Pure: the caller passes the time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

ACTIVE_S = 1.0  # a tenant that started a request this recently still counts as active
# requests a tenant may always hold in progress (enough to keep two slots' forwards full of short
# requests), at most three quarters of the model's queue limit (`floor_for`)
FLOOR = 48
MAX_REMEMBERED = 4096  # idle tenants remembered; the oldest are forgotten first


def floor_for(max_queue: int) -> int:
    """The floor under a model's queue limit (`--max-queue`): FLOOR, or three quarters of the
    limit when that is less. A flood paced at the floor and a light tenant then stay within the
    limit; past it the flood would be refused down to its weight's share (R-FAIR-4), and each
    refused client asking again at once costs the loop more than its request would."""
    return max(1, min(FLOOR, max_queue * 3 // 4))


@dataclass
class ReadPacing:
    weight: Callable[[str], float]
    active_s: float = ACTIVE_S
    floor: int = FLOOR
    _in_progress: dict[str, int] = field(default_factory=dict)
    _last_start: dict[str, float] = field(default_factory=dict)

    def started(self, tenant: str, now: float) -> None:
        """A request of TENANT was read and is being served."""
        self._in_progress[tenant] = self._in_progress.get(tenant, 0) + 1
        self._last_start.pop(tenant, None)  # re-inserted last: the dict stays in order of last start
        self._last_start[tenant] = now
        if len(self._last_start) > MAX_REMEMBERED:
            self._forget(now)

    def finished(self, tenant: str) -> None:
        """A request of TENANT was answered (or dropped)."""
        left = self._in_progress.get(tenant, 0) - 1
        if left > 0:
            self._in_progress[tenant] = left
        else:
            self._in_progress.pop(tenant, None)

    def in_progress(self, tenant: str) -> int:
        return self._in_progress.get(tenant, 0)

    def active(self, now: float) -> list[str]:
        """The tenants holding a request or having started one within `active_s`."""
        recent = {t for t, start in self._last_start.items() if now - start <= self.active_s}
        return sorted(recent | self._in_progress.keys())

    def paced(self, tenant: str, now: float) -> bool:
        """Whether TENANT's next request waits its turn to be read (see the module docstring)."""
        mine = self._in_progress.get(tenant, 0)
        if mine < max(1, self.floor):
            return False
        active = self.active(now)
        if len(active) < 2 or tenant not in active:
            return False
        weights = sum(self.weight(t) for t in active)
        held = sum(self._in_progress.get(t, 0) for t in active)
        return mine * weights > self.weight(tenant) * held

    def _forget(self, now: float) -> None:
        for tenant, start in list(self._last_start.items()):
            if len(self._last_start) <= MAX_REMEMBERED and now - start <= self.active_s:
                break
            if tenant not in self._in_progress:
                del self._last_start[tenant]
