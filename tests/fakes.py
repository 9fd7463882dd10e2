"""First-class fakes of the ports (no torch, no I/O): the domain's Clock and Rng, a forward for
the scheduler, and the adapters' Device and ModelStore contracts. The fake family and engine
are in `tests/fake_family.py`."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_srun.domain.errors import ModelNotFound


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
class FakeForward:
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


@dataclass(frozen=True)
class FakeDevice:
    """A `Device` of any kind and memory size (R-DEV-1 classes), without the hardware."""

    kind: str = "cpu"
    index: int | None = None
    total: int | None = None
    free: int | None = None
    native_dtypes: frozenset[str] = frozenset({"float32"})
    synchronized: list[int] = field(default_factory=list, compare=False)

    @property
    def name(self) -> str:
        return self.kind if self.index is None else f"{self.kind}:{self.index}"

    @property
    def torch_device(self) -> str:
        return "meta"  # any tensor a family creates on it has no data: wrong placement fails loudly

    def memory_total(self) -> int | None:
        return self.total

    def memory_free(self) -> int | None:
        return self.free if self.free is not None else self.total

    def synchronize(self) -> None:
        self.synchronized.append(1)


@dataclass
class FakeStore:
    """A `ModelStore` over a dict of names to folders."""

    folders: dict[str, Path]
    root: Path
    engine_cache: Path
    pulled: list[str] = field(default_factory=list)

    def resolve(self, artifact: str, progress: Callable[[str], None]) -> Path:
        if artifact in self.folders:
            return self.folders[artifact]
        if Path(artifact).is_dir():
            return Path(artifact)
        raise ModelNotFound(f"model {artifact!r} is not in the fake store")

    def pull(self, name: str, progress: Callable[[str], None]) -> Path:
        self.pulled.append(name)
        return self.resolve(name, progress)
