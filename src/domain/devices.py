"""Default batch limits by device memory class (R-DEV-1)."""

from __future__ import annotations

from dataclasses import dataclass

GB = 1_000_000_000


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


def class_limits(device_kind: str, memory_bytes: int | None) -> ClassLimits:
    """Limits for a device: CPUs and devices that report no memory get the CPU row."""
    if device_kind == "cpu" or not memory_bytes:
        return CPU_LIMITS
    for floor, limits in _GPU_TABLE:
        if memory_bytes >= floor:
            return limits
    return _GPU_TABLE[-1][1]  # pragma: no cover - the last floor is 0
