"""What the host CPU computes natively (read from /proc/cpuinfo; no torch import)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})  # x86 AVX-512/AMX, Arm (Features: bf16)


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            flags.update(value.split())
    return frozenset(flags)


def cpu_has_native_bf16() -> bool:
    return bool(cpu_flags() & BF16_FLAGS)
