"""This CPU's FP32 peak, derived and said how: vector width × FMA units × 2 FLOP per FMA × cores ×
clock, each factor read from the machine where it can be (flags, CPU family, clock source) and
named where it comes from a table. Also two measured ceilings on MiniLM's feed-forward shape
(384 → 1536): MKL's sgemm (`torch.matmul`) and oneDNN's FP32 linear on a pre-packed weight
(`torch.ops.mkldnn._linear_pointwise` on `_reorder_linear_weight`, the kernel our CPU engine runs),
1,024–4,096 rows, best of several. On the AMD CPU this was written on, oneDNN's reaches about
twice MKL's there, so oneDNN's is the ceiling the benchmarks divide by.

MiniLM's FLOPs per request are counted from its config and the request's real tokens
(`encoder_flops`), so `achieved GFLOP/s = req/s × GFLOP per request`.
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Peak:
    gflops: float
    derivation: str


def _cpuinfo() -> dict[str, str]:
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            key = key.strip().lower()
            if key and key not in fields:
                fields[key] = value.strip()
    except OSError:
        pass
    return fields


def host_kind() -> str:
    """The CPU's name with its family and model, as every figure names its host (AMD family 25:
    Zen 3 / Zen 4 by model, 26: Zen 5)."""
    info = _cpuinfo()
    name = info.get("model name") or platform.processor() or "unknown CPU"
    return f"{name} (cpu family {info.get('cpu family', '?')} model {info.get('model', '?')})"


def _clock_ghz(info: dict[str, str]) -> tuple[float, str]:
    for path in (
        "/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq",
        "/sys/devices/system/cpu/cpu0/cpufreq/base_frequency",
    ):
        try:
            return int(Path(path).read_text()) / 1e6, path
        except (OSError, ValueError):
            continue
    if info.get("cpu mhz"):
        return float(info["cpu mhz"]) / 1000, "/proc/cpuinfo 'cpu MHz' (nominal; a core that boosts runs faster)"
    if info.get("bogomips") and platform.machine() in ("x86_64", "AMD64"):
        return float(info["bogomips"]) / 2000, "/proc/cpuinfo bogomips / 2 (x86 counts two per cycle; no cpufreq here)"
    return 2.0, "unknown clock: 2 GHz assumed"


def _fma(info: dict[str, str], flags: set[str]) -> tuple[int, int, str]:
    """(FP32 lanes of the widest vector, FMA units per core, why)."""
    vendor, family = info.get("vendor_id", ""), int(info.get("cpu family", "0") or 0)
    model = int(info.get("model", "0") or 0)
    if "avx512f" in flags:
        lanes = 16
        if vendor == "AuthenticAMD" and family == 25:
            return lanes, 1, f"AMD Zen 4 (family {family} model {model}): 512-bit FMAs on two 256-bit pipes = 1 unit"
        if vendor == "AuthenticAMD" and family >= 26:
            return lanes, 2, f"AMD Zen 5 (family {family}): two 512-bit FMA units"
        return lanes, 2, "Intel AVX-512 server core: two 512-bit FMA units (table; some SKUs have one)"
    if "avx2" in flags and "fma" in flags:
        return 8, 2, "AVX2 + FMA core: two 256-bit FMA units (table)"
    return 4, 1, "SSE: one 128-bit unit, no FMA fusion assumed"


def fp32_peak(cores: int) -> Peak:
    info = _cpuinfo()
    flags = set(info.get("flags", "").split())
    lanes, units, why = _fma(info, flags)
    ghz, clock_src = _clock_ghz(info)
    gflops = lanes * units * 2 * cores * ghz
    text = (
        f"{lanes} FP32 lanes ({'avx512f' if lanes == 16 else 'avx2' if lanes == 8 else 'sse'}) × {units} FMA unit(s) "
        f"× 2 FLOP/FMA × {cores} core(s) × {ghz:.3f} GHz = {gflops:.0f} GFLOP/s  [{why}; clock: {clock_src}; "
        f"CPU: {info.get('model name', platform.processor())}]"
    )
    return Peak(gflops, text)


def measured_gemm_gflops(threads: int, m: int = 2048, k: int = 384, n: int = 1536, repeats: int = 10) -> float:
    """GFLOP/s of an FP32 [M, K] × [K, N] product (`torch.matmul`: MKL's sgemm) at THREADS."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(m, k), torch.randn(k, n)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * m * k * n / best / 1e9


@dataclass(frozen=True)
class Ceiling:
    gflops: float
    rows: int  # the row count that reached it


def measured_linear_gflops(
    threads: int, rows: tuple[int, ...] = (1024, 2048, 4096), k: int = 384, n: int = 1536, repeats: int = 10
) -> Ceiling:
    """The best GFLOP/s of oneDNN's FP32 linear ([ROWS, K] → [ROWS, N], bias, weight pre-packed once)
    at THREADS over ROWS and REPEATS; falls back to sgemm where torch has no oneDNN."""
    import torch

    torch.set_num_threads(threads)
    if not torch.backends.mkldnn.is_available():
        return Ceiling(measured_gemm_gflops(threads, rows[-1], k, n, repeats), rows[-1])
    gen = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(n, k, generator=gen), torch.randn(n, generator=gen)
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, 64)
    best = Ceiling(0.0, rows[0])
    for m in rows:
        x = torch.randn(m, k, generator=gen)
        torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")  # oneDNN builds its primitive
        fastest = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
            fastest = min(fastest, time.perf_counter() - start)
        gflops = 2 * m * k * n / fastest / 1e9
        if gflops > best.gflops:
            best = Ceiling(gflops, m)
    return best


def encoder_flops(tokens: int, hidden: int, layers: int, intermediate: int) -> float:
    """Multiply-add FLOPs of one unpadded BERT row of TOKENS tokens (linears and attention)."""
    linears = 2 * tokens * (4 * hidden * hidden + 2 * hidden * intermediate)
    attention = 2 * 2 * tokens * tokens * hidden  # QKᵀ and the weighted sum of V
    return layers * (linears + attention)


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
