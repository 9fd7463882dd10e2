"""Devices as rules (R-DEV-1, R-DEV-3): default batch limits by memory class, what a `--device`
value names, whether this machine has it, and which GPU `--device auto` takes.

Pure: the device adapter (`adapters/devices/torch_devices.py`) asks torch what the machine has
and hands it in as a `DeviceInventory` and `GpuMemory` figures; every decision and every
refusal's one line is made here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

GB = 1_000_000_000
GIB = 1 << 30

GPU_KINDS = frozenset({"cuda", "rocm"})
# `--device auto` takes the first GPU with at least this share of its memory free (and AUTO_MIN_FREE_BYTES)
AUTO_MIN_FREE_FRACTION = 0.2
AUTO_MIN_FREE_BYTES = 1 * GIB

DEVICE_NAME = re.compile(r"(cpu|auto|mps|cuda|rocm)(?::([0-9]+))?")


@dataclass(frozen=True, slots=True)
class ClassLimits:
    max_num_batched_tokens: int
    max_num_seqs: int
    memory_class: str


_GPU_TABLE: tuple[tuple[float, ClassLimits], ...] = (
    (160 * GB, ClassLimits(32_768, 256, ">=160GB")),
    (64 * GB, ClassLimits(16_384, 128, "64-160GB")),
    (32 * GB, ClassLimits(8_192, 64, "32-64GB")),
    (0, ClassLimits(4_096, 32, "<32GB")),
)

CPU_LIMITS = ClassLimits(65_536, 8_192, "cpu")
# MPS and plugin devices that report no memory of their own get the CPU row under their own name
UNREPORTED_LIMITS = ClassLimits(CPU_LIMITS.max_num_batched_tokens, CPU_LIMITS.max_num_seqs, "unreported")


def class_limits(device_kind: str, memory_bytes: int | None) -> ClassLimits:
    """Limits for a device: CPUs get the CPU row, devices that report no memory its values."""
    if device_kind == "cpu":
        return CPU_LIMITS
    if not memory_bytes:
        return UNREPORTED_LIMITS
    for floor, limits in _GPU_TABLE:
        if memory_bytes >= floor:
            return limits
    return _GPU_TABLE[-1][1]  # pragma: no cover - the last floor is 0


# ---- what a --device value names, and whether it is here -----------------------------------------
class DeviceRefused(ValueError):
    """The asked device does not exist here, or this build cannot drive it (one line)."""


@dataclass(frozen=True, slots=True)
class DeviceInventory:
    """What this process can drive, as the device adapter found it."""

    gpu_platform: str | None  # "cuda" or "rocm" for a torch GPU build, None for a CPU-only build
    gpu_count: int  # GPUs visible to this process (0 on a CPU-only build)
    mps: bool = False  # Apple's MPS backend is available
    build: str = ""  # how the build describes itself in messages, e.g. "torch 2.13.0+cpu"


@dataclass(frozen=True, slots=True)
class GpuMemory:
    index: int
    total: int
    free: int


@dataclass(frozen=True, slots=True)
class DeviceChoice:
    """The device a `--device` value resolved to, and (for auto) why."""

    kind: str  # cpu | cuda | rocm | mps
    index: int | None
    reason: str = ""

    @property
    def name(self) -> str:
        return self.kind if self.index is None else f"{self.kind}:{self.index}"


def parse_device(name: str) -> tuple[str, int | None]:
    """`cuda:1` → ("cuda", 1); `cuda` → ("cuda", 0); `cpu` → ("cpu", None). DeviceRefused otherwise."""
    match = DEVICE_NAME.fullmatch(name)
    if match is None:
        raise DeviceRefused(f"--device {name}: expected cpu, cuda:N, rocm:N, mps or auto")
    kind, index = match.group(1), match.group(2)
    if kind in GPU_KINDS:
        return kind, int(index or 0)
    if index is not None:
        raise DeviceRefused(f"--device {name}: {kind} takes no index")
    return kind, None


def gpu_refusal(kind: str, index: int, inventory: DeviceInventory) -> str | None:
    """Why GPU KIND:INDEX cannot be used in this process (one line), or None."""
    name = f"{kind}:{index}"
    if inventory.gpu_platform is None:
        return f"--device {name}: this torch build has no GPU support ({inventory.build or 'CPU-only'})"
    if kind == "rocm" and inventory.gpu_platform != "rocm":
        return (
            f"--device {name}: this torch build drives {inventory.gpu_platform.upper()} GPUs, not ROCm "
            f"({inventory.build}); use --device cuda:{index}, or install torch's ROCm build"
        )
    if inventory.gpu_count == 0:
        return f"--device {name}: no GPU is visible to this process ({inventory.build})"
    if index >= inventory.gpu_count:
        seen = ", ".join(f"{kind}:{i}" for i in range(inventory.gpu_count))
        return f"--device {name}: GPU index out of range; this process sees {inventory.gpu_count} GPU(s): {seen}"
    return None


def has_room(gpu: GpuMemory) -> bool:
    """Whether `--device auto` may take GPU: enough of its memory is free."""
    return gpu.free >= max(AUTO_MIN_FREE_BYTES, AUTO_MIN_FREE_FRACTION * gpu.total)


def pick_auto(inventory: DeviceInventory, gpus: Sequence[GpuMemory]) -> DeviceChoice:
    """`--device auto`: the first GPU with room (`has_room`), else the CPU, with the reason."""
    if inventory.gpu_platform is None or inventory.gpu_count == 0:
        return DeviceChoice("cpu", None, f"auto: no GPU visible ({inventory.build or 'CPU-only'})")
    kind = inventory.gpu_platform
    for gpu in sorted(gpus, key=lambda g: g.index):
        if has_room(gpu):
            return DeviceChoice(
                kind, gpu.index, f"auto: {kind}:{gpu.index}, {_gib(gpu.free)} of {_gib(gpu.total)} free"
            )
    full = ", ".join(f"{kind}:{g.index} {_gib(g.free)} free of {_gib(g.total)}" for g in gpus)
    return DeviceChoice("cpu", None, f"auto: no GPU with room ({full})")


def resolve_device(name: str, inventory: DeviceInventory, gpus: Sequence[GpuMemory] = ()) -> DeviceChoice:
    """The device NAME means on this machine; DeviceRefused (one line) when it is not here.
    GPUS (memory of each visible GPU) is needed only for `auto`."""
    kind, index = parse_device(name)
    if kind == "cpu":
        return DeviceChoice("cpu", None)
    if kind == "auto":
        return pick_auto(inventory, gpus)
    if kind == "mps":
        if not inventory.mps:
            raise DeviceRefused(
                "--device mps: MPS is not available here (it needs Apple silicon and torch's MPS build)"
            )
        return DeviceChoice("mps", None)
    assert index is not None
    refusal = gpu_refusal(kind, index, inventory)
    if refusal:
        raise DeviceRefused(refusal)
    return DeviceChoice(kind, index)


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"
