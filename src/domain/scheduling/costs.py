"""Cost per token, learned online as an EMA per lane (R-BAT-6/7)."""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_SECONDS_PER_TOKEN = 2e-5
DEFAULT_ALPHA = 0.1


@dataclass
class CostModel:
    alpha: float = DEFAULT_ALPHA
    initial: float = DEFAULT_SECONDS_PER_TOKEN
    _per_token: dict[str, float] = field(default_factory=dict)
    _samples: dict[str, int] = field(default_factory=dict)

    def seconds_per_token(self, lane: str) -> float:
        return self._per_token.get(lane, self.initial)

    def samples(self, lane: str) -> int:
        return self._samples.get(lane, 0)

    def seed(self, lane: str, seconds_per_token: float) -> None:
        """Start LANE from a measured cost (e.g. the GPU calibration's, R-DEV-2) instead of the
        prior; the next observation moves it by the EMA, not outright."""
        if seconds_per_token <= 0:
            raise ValueError(f"a cost per token must be > 0, got {seconds_per_token}")
        self._per_token[lane] = seconds_per_token
        self._samples[lane] = max(self._samples.get(lane, 0), 1)

    def observe(self, lane: str, tokens: int, seconds: float) -> None:
        if tokens <= 0 or seconds < 0:
            return
        sample = seconds / tokens
        n = self._samples.get(lane, 0)
        old = self._per_token.get(lane)
        # the first sample replaces the prior outright: the prior is a guess, not a measurement
        self._per_token[lane] = sample if old is None or n == 0 else old + self.alpha * (sample - old)
        self._samples[lane] = n + 1

    def estimate(self, lane: str, tokens: int) -> float:
        return tokens * self.seconds_per_token(lane)
