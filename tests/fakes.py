"""First-class fakes for the domain's ports (no torch, no I/O)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Sequence


@dataclass
class FakeClock:
    t: float = 1000.0

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        assert seconds >= 0
        self.t += seconds


@dataclass
class FakeRng:
    seed: int = 0
    _r: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self._r = random.Random(self.seed)

    def random(self) -> float:
        return self._r.random()


class EngineFailure(RuntimeError):
    pass


@dataclass
class FakeEngine:
    """Echoes each row's payload back. Can be slow (advances a FakeClock), fail on demand, or be
    batch-variant (adds a tiny offset that depends on the forward's size, like real GEMMs)."""

    clock: FakeClock | None = None
    seconds_per_token: float = 1e-5
    fail_next: int = 0
    batch_variant: bool = False
    forwards: list[tuple[str, tuple[Any, ...]]] = field(default_factory=list)

    def run(self, lane: str, payloads: Sequence[Any]) -> list[Any]:
        self.forwards.append((lane, tuple(payloads)))
        if self.clock is not None:
            self.clock.advance(self.seconds_per_token * max(1, len(payloads)))
        if self.fail_next > 0:
            self.fail_next -= 1
            raise EngineFailure("injected forward failure")
        if self.batch_variant:
            return [(p, len(payloads) * 1e-7) for p in payloads]
        return list(payloads)
