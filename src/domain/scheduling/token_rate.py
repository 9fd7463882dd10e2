"""A tenant's token rate (R-FAIR-4): a token bucket of one second of its rate.

The bucket starts full and refills at `tokens_per_s` up to one second's worth. A request of N
tokens is admitted while the bucket holds min(N, capacity) (one larger than a second's worth
gets in when the bucket is full, and leaves it in debt), and takes N from it. `wait_s` says
when a refused request would get in. Pure: the caller passes the time.
"""

from __future__ import annotations

BURST_S = 1.0  # the bucket holds this many seconds of the rate


class TokenRate:
    def __init__(self, tokens_per_s: float, now: float) -> None:
        if tokens_per_s <= 0:
            raise ValueError("a token rate is > 0")
        self.tokens_per_s = tokens_per_s
        self.capacity = tokens_per_s * BURST_S
        self._level = self.capacity
        self._at = now

    def level(self, now: float) -> float:
        """Tokens in the bucket now (negative: in debt)."""
        return min(self.capacity, self._level + max(0.0, now - self._at) * self.tokens_per_s)

    def full(self, now: float) -> bool:
        return self.level(now) >= self.capacity

    def wait_s(self, tokens: int, now: float) -> float:
        """Seconds until TOKENS would be admitted (0: now)."""
        missing = min(float(tokens), self.capacity) - self.level(now)
        return max(0.0, missing / self.tokens_per_s)

    def take(self, tokens: int, now: float) -> None:
        self._level = self.level(now) - tokens
        self._at = max(self._at, now)
