"""Ports: the small Protocols the domain talks through. Adapters implement them; tests fake them.

Time and randomness are ports so that windows, costs, backoff and ejection are deterministic
under test. Nothing in the domain reads a clock or a random source directly.
"""

from __future__ import annotations

from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Monotonic seconds."""
        ...


class Rng(Protocol):
    def random(self) -> float:
        """A float in [0, 1)."""
        ...
