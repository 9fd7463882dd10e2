"""Admission control at the worker (R-ADM-1): how much unanswered work one model may hold.

Each served model counts its unanswered requests and their tokens. A request (or a bundle's
tasks for one model, admitted together or not at all) is refused with `Overloaded` when it
would take the model past `max_queue` requests or `max_queued_tokens` tokens. The token limit
applies only while something is pending, so one request larger than the limit still gets in
alone; so does the queue limit (a bundle with more tasks than `max_queue`).

Tokens are counted before any tokenization: the caller passes a cheap upper bound taken from
the request body (the HTTP adapter uses its size in bytes; a token covers at least one byte of
the text it reads, so the bytes bound the text's tokens).

`Retry-After` comes from the measured drain rate: the work answered in the last `horizon_s`
seconds divided by the time the model had work pending in that span. The suggestion is the
time that rate needs to answer what is pending now, in the dimension that refused the
request, rounded up and kept within [1, 60] seconds; 1 s until anything was measured.

A client that ignores Retry-After and asks again on the same connection at once is held until
its Retry-After has passed (`RetryDiscipline`): under a closed loop of retries the worker then
spends its time on forwards, not on refusals.

Pure: the caller passes the time.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from .errors import Overloaded

HORIZON_S = 10.0
MIN_BUSY_S = 0.05  # less busy time than this measures nothing
MIN_RETRY_AFTER_S = 1
MAX_RETRY_AFTER_S = 60


@dataclass(frozen=True, slots=True)
class AdmissionLimits:
    max_queue: int
    max_queued_tokens: int

    def __post_init__(self) -> None:
        if self.max_queue < 1 or self.max_queued_tokens < 1:
            raise ValueError("admission limits are >= 1")


@dataclass(frozen=True, slots=True)
class DrainRate:
    requests_per_s: float
    tokens_per_s: float


@dataclass(slots=True)
class Ticket:
    """What one admission holds until it is released (exactly once)."""

    requests: int
    tokens: int
    released: bool = False


class Admission:
    def __init__(self, limits: AdmissionLimits, *, horizon_s: float = HORIZON_S) -> None:
        if horizon_s <= 0:
            raise ValueError("horizon_s must be > 0")
        self.limits = limits
        self.horizon_s = horizon_s
        self.pending_requests = 0
        self.pending_tokens = 0
        self._answered: deque[tuple[float, int, int]] = deque()  # (when, requests, tokens)
        self._busy: deque[tuple[float, float]] = deque()  # closed spans with work pending
        self._busy_since: float | None = None

    # ---- admission -----------------------------------------------------------------------
    def admit(self, requests: int, tokens: int, now: float) -> Ticket:
        """Hold REQUESTS requests of TOKENS tokens in all, or raise `Overloaded`."""
        if requests < 1 or tokens < 0:
            raise ValueError("an admission holds at least one request and no negative tokens")
        if self.pending_requests:
            limits = self.limits
            if self.pending_requests + requests > limits.max_queue:
                raise Overloaded(
                    f"{self.pending_requests} requests are unanswered (--max-queue {limits.max_queue})",
                    self.retry_after_s(now, by_tokens=False),
                )
            if self.pending_tokens + tokens > limits.max_queued_tokens:
                raise Overloaded(
                    f"{self.pending_tokens} tokens are unanswered (--max-queued-tokens {limits.max_queued_tokens})",
                    self.retry_after_s(now, by_tokens=True),
                )
        else:
            self._busy_since = now
        self.pending_requests += requests
        self.pending_tokens += tokens
        return Ticket(requests, tokens)

    def release(self, ticket: Ticket, now: float, *, answered: bool) -> None:
        """The ticket's requests left: answered (they count as drained work) or not."""
        if ticket.released:
            raise ValueError("a ticket is released once")
        ticket.released = True
        self.pending_requests -= ticket.requests
        self.pending_tokens -= ticket.tokens
        if answered:
            self._answered.append((now, ticket.requests, ticket.tokens))
        if self.pending_requests == 0 and self._busy_since is not None:
            self._busy.append((self._busy_since, now))
            self._busy_since = None
        self._forget(now)

    # ---- the drain rate ------------------------------------------------------------------
    def drain_rate(self, now: float) -> DrainRate | None:
        """Work answered per second of pending work over the horizon; None: nothing measured."""
        self._forget(now)
        busy = self._busy_time(now)
        if busy < MIN_BUSY_S or not self._answered:
            return None
        requests = sum(r for _, r, _ in self._answered)
        tokens = sum(t for _, _, t in self._answered)
        return DrainRate(requests / busy, tokens / busy)

    def retry_after_s(self, now: float, *, by_tokens: bool) -> int:
        """Seconds the measured rate needs to answer what is pending, within [1, 60]."""
        rate = self.drain_rate(now)
        if rate is None:
            return MIN_RETRY_AFTER_S
        speed = rate.tokens_per_s if by_tokens else rate.requests_per_s
        work = self.pending_tokens if by_tokens else self.pending_requests
        if speed <= 0:
            return MAX_RETRY_AFTER_S
        return max(MIN_RETRY_AFTER_S, min(MAX_RETRY_AFTER_S, math.ceil(work / speed)))

    def _busy_time(self, now: float) -> float:
        start = now - self.horizon_s
        spans = list(self._busy)
        if self._busy_since is not None:
            spans.append((self._busy_since, now))
        return sum(max(0.0, min(end, now) - max(begin, start)) for begin, end in spans)

    def _forget(self, now: float) -> None:
        start = now - self.horizon_s
        while self._answered and self._answered[0][0] < start:
            self._answered.popleft()
        while self._busy and self._busy[0][1] < start:
            self._busy.popleft()


class RetryDiscipline:
    """Clients that retry before their Retry-After wait it out (R-ADM-1).

    A connection refused with Retry-After S that asks again within S seconds has that request
    held until the S seconds have passed, then tried like any other. A client that honours
    Retry-After never waits here; one that ignores it (a closed loop of retries) is slowed to
    one try per Retry-After per connection instead of spinning the event loop on refusals.
    Keys are opaque (the HTTP adapter uses the TCP peer); at most `max_keys` are remembered.
    """

    def __init__(self, max_keys: int = 65_536) -> None:
        self.max_keys = max_keys
        self._not_before: dict[object, float] = {}

    def __len__(self) -> int:
        """How many clients it remembers (at most `max_keys`)."""
        return len(self._not_before)

    def wait_s(self, key: object, now: float) -> float:
        """How long this request must wait before it is tried (0: at once)."""
        until = self._not_before.pop(key, None)
        return 0.0 if until is None else max(0.0, until - now)

    def refused(self, key: object, now: float, retry_after_s: float) -> None:
        if len(self._not_before) >= self.max_keys:
            self._not_before = {k: t for k, t in self._not_before.items() if t > now}
            if len(self._not_before) >= self.max_keys:
                return  # too many clients to remember: no holding, never unbounded memory
        self._not_before[key] = now + retry_after_s
