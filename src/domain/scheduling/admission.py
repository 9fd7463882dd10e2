"""Admission control at the worker (R-ADM-1): how much unanswered work one model may hold.

Each served model counts its unanswered requests and their tokens. A request (or a bundle's
tasks for one model, admitted together or not at all) is refused with `Overloaded` when it
would take the model past `max_queue` requests or `max_queued_tokens` tokens. The token limit
applies only while something is pending, so one request larger than the limit still gets in
alone; so does the queue limit (a bundle with more tasks than `max_queue`).

Tokens are counted before any tokenization: the caller passes a cheap upper bound taken from
the request body (the HTTP adapter uses its size in bytes; a token covers at least one byte of
the text it reads, so the bytes bound the text's tokens). Once the request's rows are made, the
ticket holds their tokens instead (`count_rows`; never more than the bound): English text is
about four bytes a token, so held at the bound, concurrent requests of long texts passed the
default 65,536 tokens that their real tokens are far within, and some of them were refused (the
measurement: docs/performance.md).

`Retry-After` comes from the measured drain rate: the work answered in the last `horizon_s`
seconds divided by the time the model had work pending in that span. The suggestion is the
time that rate needs to answer what is pending now, in the dimension that refused the
request, rounded up and kept within [1, 60] seconds; 1 s until anything was measured.

A client that ignores Retry-After and asks again on the same connection at once is held until
its Retry-After has passed (`RetryDiscipline`): under a closed loop of retries the worker then
spends its time on forwards, not on refusals.

Tenants (R-FAIR-4): every admission is for a tenant (`domain/scheduling/tenants.py`). A tenant whose policy
sets `tokens_per_s` is refused while its token bucket (`domain/scheduling/token_rate.py`) lacks the tokens,
one that sets `max_queued_tokens` while it holds something and the request would take it past
that; both refusals say when its own work allows the next one. The model's limits are shared by
weight: past them, a request is refused only when its tenant already holds something and would
hold more than its weight's share of the limit among the tenants holding work (it included);
a tenant within its share gets in, up to `OVERSHARE` times the model's limits in all. With one
tenant its share is the whole limit: the rule above, unchanged.

Pure: the caller passes the time.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from vllm_srun.domain.errors import Overloaded, quoted
from vllm_srun.domain.scheduling.tenants import DEFAULT_TENANT, DEFAULT_TENANTS, TenantTable
from vllm_srun.domain.scheduling.token_rate import TokenRate

HORIZON_S = 10.0
MIN_BUSY_S = 0.05  # less busy time than this measures nothing
MIN_RETRY_AFTER_S = 1
MAX_RETRY_AFTER_S = 60
OVERSHARE = 2  # tenants within their share may take the model this far past its limits
MAX_RATE_BUCKETS = 4096  # tenants' token buckets remembered; full ones are forgotten first


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
    tokens: int  # what it holds now: BOUND, then its rows' tokens once they are made (`count_rows`)
    released: bool = False
    tenant: str = DEFAULT_TENANT
    bound: int = 0  # the tokens it was admitted with (an upper bound)
    counted: int = 0  # tokens of the rows made so far


class Admission:
    def __init__(
        self, limits: AdmissionLimits, *, horizon_s: float = HORIZON_S, tenants: TenantTable = DEFAULT_TENANTS
    ) -> None:
        if horizon_s <= 0:
            raise ValueError("horizon_s must be > 0")
        self.limits = limits
        self.tenants = tenants
        self._held: dict[str, tuple[int, int]] = {}  # tenant → (requests, tokens) it holds
        self._rates: dict[str, TokenRate] = {}
        self.horizon_s = horizon_s
        self.pending_requests = 0
        self.pending_tokens = 0
        self._answered: deque[tuple[float, int, int]] = deque()  # (when, requests, tokens)
        self._busy: deque[tuple[float, float]] = deque()  # closed spans with work pending
        self._busy_since: float | None = None

    # ---- admission -----------------------------------------------------------------------
    def admit(self, requests: int, tokens: int, now: float, tenant: str = DEFAULT_TENANT) -> Ticket:
        """Hold REQUESTS requests of TOKENS tokens in all for TENANT, or raise `Overloaded`."""
        if requests < 1 or tokens < 0:
            raise ValueError("an admission holds at least one request and no negative tokens")
        rate = self._rate(tenant, now)
        if rate is not None and (wait := rate.wait_s(tokens, now)) > 0:
            raise Overloaded(
                f"tenant {quoted(tenant)} sends more than its {rate.tokens_per_s:g} tokens/s", _seconds(wait)
            )
        self._check_tenant_limit(tenant, tokens, now)
        if self.pending_requests:
            self._check_model_limits(tenant, requests, tokens, now)
        else:
            self._busy_since = now
        if rate is not None:
            rate.take(tokens, now)
        self.pending_requests += requests
        self.pending_tokens += tokens
        held_requests, held_tokens = self._held.get(tenant, (0, 0))
        self._held[tenant] = (held_requests + requests, held_tokens + tokens)
        return Ticket(requests, tokens, tenant=tenant, bound=tokens)

    def count_rows(self, ticket: Ticket, tokens: int) -> None:
        """The ticket's requests made rows of TOKENS tokens (more calls add up): from now on it
        holds their tokens in all instead of the bound it was admitted with, never more than that
        bound. A released ticket holds nothing: no-op."""
        if tokens < 0:
            raise ValueError("rows hold no negative tokens")
        if ticket.released:
            return
        ticket.counted += tokens
        holds = min(ticket.bound, ticket.counted)
        change = holds - ticket.tokens
        if change == 0:
            return
        ticket.tokens = holds
        self.pending_tokens += change
        held_requests, held_tokens = self._held[ticket.tenant]
        self._held[ticket.tenant] = (held_requests, held_tokens + change)

    def held(self, tenant: str) -> tuple[int, int]:
        """The requests and tokens TENANT holds unanswered."""
        return self._held.get(tenant, (0, 0))

    def _check_tenant_limit(self, tenant: str, tokens: int, now: float) -> None:
        limit = self.tenants.policy(tenant).max_queued_tokens
        held_requests, held_tokens = self.held(tenant)
        if limit is None or not held_requests or held_tokens + tokens <= limit:
            return
        rate = self.drain_rate(now)
        share = self._weight_share(tenant)
        speed = rate.tokens_per_s * share if rate is not None else 0.0
        wait = held_tokens / speed if speed > 0 else MIN_RETRY_AFTER_S
        raise Overloaded(
            f"tenant {quoted(tenant)} holds {held_tokens} unanswered tokens (its limit {limit})", _seconds(wait)
        )

    def _check_model_limits(self, tenant: str, requests: int, tokens: int, now: float) -> None:
        limits = self.limits
        over_requests = self.pending_requests + requests > limits.max_queue
        over_tokens = self.pending_tokens + tokens > limits.max_queued_tokens
        if not (over_requests or over_tokens) or self._within_share(tenant, requests, tokens):
            return
        if over_requests:
            raise Overloaded(
                f"{self.pending_requests} requests are unanswered (--max-queue {limits.max_queue})",
                self.retry_after_s(now, by_tokens=False),
            )
        raise Overloaded(
            f"{self.pending_tokens} tokens are unanswered (--max-queued-tokens {limits.max_queued_tokens})",
            self.retry_after_s(now, by_tokens=True),
        )

    def _within_share(self, tenant: str, requests: int, tokens: int) -> bool:
        """Past the model's limits, TENANT still gets in while it holds nothing or stays within its
        weight's share of them, and the model stays within OVERSHARE times its limits."""
        limits = self.limits
        if self.pending_requests + requests > OVERSHARE * limits.max_queue:
            return False
        if self.pending_tokens + tokens > OVERSHARE * limits.max_queued_tokens:
            return False
        held_requests, held_tokens = self.held(tenant)
        if not held_requests:
            return True
        share = self._weight_share(tenant)
        return (
            held_requests + requests <= share * limits.max_queue
            and held_tokens + tokens <= share * limits.max_queued_tokens
        )

    def _weight_share(self, tenant: str) -> float:
        """TENANT's weight over that of the tenants holding work, it included."""
        weights = {name: self.tenants.weight(name) for name in (*self._held, tenant)}
        return weights[tenant] / sum(weights.values())

    def _rate(self, tenant: str, now: float) -> TokenRate | None:
        tokens_per_s = self.tenants.policy(tenant).tokens_per_s
        if tokens_per_s is None:
            return None
        found = self._rates.get(tenant)
        if found is None:
            if len(self._rates) >= MAX_RATE_BUCKETS:  # a full bucket is what a new one would be
                self._rates = {name: r for name, r in self._rates.items() if not r.full(now)}
            found = self._rates[tenant] = TokenRate(tokens_per_s, now)
        return found

    def release(self, ticket: Ticket, now: float, *, answered: bool) -> None:
        """The ticket's requests left: answered (they count as drained work) or not."""
        if ticket.released:
            raise ValueError("a ticket is released once")
        ticket.released = True
        self.pending_requests -= ticket.requests
        self.pending_tokens -= ticket.tokens
        held_requests, held_tokens = self._held.pop(ticket.tenant, (0, 0))
        if held_requests > ticket.requests:
            self._held[ticket.tenant] = (held_requests - ticket.requests, held_tokens - ticket.tokens)
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


def _seconds(wait: float) -> int:
    """A Retry-After in whole seconds within [1, 60]."""
    return max(MIN_RETRY_AFTER_S, min(MAX_RETRY_AFTER_S, math.ceil(wait)))


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
