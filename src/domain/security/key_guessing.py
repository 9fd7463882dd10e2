"""Slowing key guessing (R-AUTH-2): a client that sends many wrong keys waits, others do not.

Wrong keys are counted per connection and per client address over a sliding window. Once a
connection has sent `per_connection` wrong keys (or an address `per_address`) within `window_s`,
every request it sends is refused (429, `Retry-After`: the seconds until its oldest counted
failure leaves the window) *without looking at its key*, so a right guess cannot be told from a
wrong one while it waits. At most `per_connection` (`per_address`) guesses per window get through.

Memory is bounded: each tracker keeps at most `max_tracked` clients with at most `limit`
timestamps each; a full tracker first forgets clients whose failures have all left the window,
then the client that failed least recently. A flood of addresses can thus make the tracker forget
an attacker early, never hold a client that sent no wrong key.

Time comes in as `now` (seconds, monotonic): the clock is the caller's.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Hashable
from dataclasses import dataclass

from vllm_srun.domain.errors import RetryLater


class TooManyWrongKeys(RetryLater):
    """This connection or address sent too many wrong keys lately (429 with `Retry-After`)."""

    code = "too_many_wrong_keys"
    default_retry_after_s = 1


@dataclass(frozen=True, slots=True)
class GuessLimits:
    per_connection: int = 5  # wrong keys one connection may send per window
    per_address: int = 20  # ... and one client address (clients behind one NAT share it)
    window_s: float = 60.0
    max_tracked: int = 4096  # clients each tracker remembers

    def __post_init__(self) -> None:
        if self.per_connection < 1 or self.per_address < 1 or self.max_tracked < 1:
            raise ValueError("guess limits and max_tracked must be >= 1")
        if not (math.isfinite(self.window_s) and self.window_s > 0):
            raise ValueError("the guess window must be > 0 seconds")


class FailureWindow:
    """Failure times per client, the most recent `limit` of each, for `max_tracked` clients."""

    def __init__(self, limit: int, window_s: float, max_tracked: int) -> None:
        self.limit = limit
        self.window_s = window_s
        self.max_tracked = max_tracked
        self._failures: OrderedDict[Hashable, deque[float]] = OrderedDict()  # least recently failed first

    def __len__(self) -> int:
        return len(self._failures)

    def wait_s(self, client: Hashable, now: float) -> float:
        """Seconds CLIENT must wait before its next request is looked at (0: it may go on)."""
        times = self._failures.get(client)
        if times is None:
            return 0.0
        self._expire(client, times, now)
        if len(times) < self.limit:
            return 0.0
        return max(0.0, times[0] + self.window_s - now)

    def failed(self, client: Hashable, now: float) -> None:
        times = self._failures.get(client)
        if times is None:
            self._make_room(now)
            times = self._failures[client] = deque(maxlen=self.limit)
        else:
            self._failures.move_to_end(client)
        times.append(now)

    def _expire(self, client: Hashable, times: deque[float], now: float) -> None:
        while times and times[0] + self.window_s <= now:
            times.popleft()
        if not times:
            del self._failures[client]

    def _make_room(self, now: float) -> None:
        while len(self._failures) >= self.max_tracked:
            client, times = next(iter(self._failures.items()))
            if times[-1] + self.window_s > now:  # the least recent one still counts: forget it anyway
                self._failures.popitem(last=False)
                return
            del self._failures[client]  # all its failures left the window


class WrongKeyLimiter:
    """Per-connection and per-address failure windows; a request waits for the longer one."""

    def __init__(self, limits: GuessLimits | None = None) -> None:
        self.limits = limits or GuessLimits()
        lim = self.limits
        self.connections = FailureWindow(lim.per_connection, lim.window_s, lim.max_tracked)
        self.addresses = FailureWindow(lim.per_address, lim.window_s, lim.max_tracked)

    def retry_after_s(self, connection: Hashable | None, address: Hashable | None, now: float) -> int | None:
        """Whole seconds to wait (Retry-After) when this client must be refused unread, else None."""
        wait = 0.0
        if connection is not None:
            wait = self.connections.wait_s(connection, now)
        if address is not None:
            wait = max(wait, self.addresses.wait_s(address, now))
        return max(1, math.ceil(wait)) if wait > 0 else None

    def failed(self, connection: Hashable | None, address: Hashable | None, now: float) -> None:
        """Count one wrong key (a missing key is no guess: it is not counted)."""
        if connection is not None:
            self.connections.failed(connection, now)
        if address is not None:
            self.addresses.failed(address, now)
