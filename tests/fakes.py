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
from vllm_srun.domain.settings.devices import DeviceInventory, GpuMemory


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


class OutOfMemoryError(RuntimeError):
    """What a fake device raises for a forward too big for it (named like torch's)."""


@dataclass(frozen=True)
class FakeDevice:
    """A `Device` of any kind and memory size (R-DEV-1 classes), without the hardware. Torch calls
    it `meta`: any tensor a family creates on it has no data, so placement is checked
    (`tests/device_guard.py`). With a COST curve (seconds of a forward of N counted tokens, None:
    out of memory) and a CLOCK, a fake family's forwards (`ran`) advance the clock and leave a
    memory peak of BYTES_PER_TOKEN × N: a GPU whose timings the calibration can read (R-DEV-2)."""

    kind: str = "cpu"
    index: int | None = None
    total: int | None = None
    free: int | None = None
    native_dtypes: frozenset[str] = frozenset({"float32"})
    cost: Callable[[int], float | None] | None = field(default=None, compare=False)
    clock: FakeClock | None = field(default=None, compare=False)
    bytes_per_token: int = 0
    synchronized: list[int] = field(default_factory=list, compare=False)
    peaks: list[int] = field(default_factory=list, compare=False)
    forwards: list[int] = field(default_factory=list, compare=False)  # counted tokens of each forward run

    def ran(self, tokens: int) -> None:
        """A forward of TOKENS counted tokens ran here."""
        self.forwards.append(tokens)
        if self.cost is None:
            return
        seconds = self.cost(tokens)
        if seconds is None:
            raise OutOfMemoryError(f"fake {self.name}: out of memory for {tokens} tokens")
        if self.clock is not None:
            self.clock.advance(seconds)
        self.peaks.append(self.bytes_per_token * tokens)

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

    def reset_peak_memory(self) -> None:
        self.peaks.clear()

    def peak_memory(self) -> int | None:
        return max(self.peaks) if self.peaks else None


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


# ---- machines, as torch would describe them (`adapters/devices/torch_devices.DeviceProbe`) ----
CUDA2 = DeviceInventory("cuda", 2, build="torch 2.13.0, CUDA 12.8")
HIP1 = DeviceInventory("rocm", 1, build="torch 2.13.0, HIP 6.4")
CPU_BUILD = DeviceInventory(None, 0, build="torch 2.13.0+cpu")
NO_GPU_VISIBLE = DeviceInventory("cuda", 0, build="torch 2.13.0, CUDA 12.8")
MAC = DeviceInventory(None, 0, mps=True, build="torch 2.13.0")


@dataclass
class FakeProbe:
    """A machine as torch would describe it."""

    machine: DeviceInventory
    memory: dict[int, tuple[int, int]] = field(default_factory=dict)  # index → (free, total)
    bf16_on_mps: bool = True
    asked: list[int] = field(default_factory=list)

    def may_have_gpu(self) -> bool:
        return self.machine.gpu_platform is not None or self.machine.mps

    def inventory(self) -> DeviceInventory:
        return self.machine

    def gpu_memory(self, index: int) -> GpuMemory:
        self.asked.append(index)
        free, total = self.memory[index]
        return GpuMemory(index, total, free)

    def mps_bf16(self) -> bool:
        return self.bf16_on_mps


@dataclass
class FakeEncoderEngine:
    """The encoder port (`EncoderEngine.forward(Batch)`): answers each row from its ids and ask
    (`(ask, sum of ids)`), remembering every batch it was given."""

    name: str = "fake-encoder"
    accounting: Any = "packed"
    kernel_switch_tokens: int | None = None
    forward_threads: bool = False
    determinism: Any = None
    batches: list[Any] = field(default_factory=list)

    def describe(self) -> dict[str, Any]:
        return {"kernels": {"linear": "fake"}}

    def forward(self, batch: Any) -> list[Any]:
        self.batches.append(batch)
        return [(ask, sum(row.ids)) for row, ask in zip(batch.rows, batch.asks, strict=True)]
