"""Load-time timings of the oneDNN fast path against eager, and their on-disk cache.

`measure(reference, packed, largest, cache_dir, progress)` returns `KernelTiming`s for one layer's
linears at a grid of token-row counts (`timed_sizes`), and where they came from. What a kernel
costs depends on the CPU, the thread count, torch/oneDNN and the layer shapes, not on the
weights, so timings are kept under `<cache>/kernels/` keyed by exactly those: the first start on
a machine measures (its time: docs/performance.md), later starts and replicas reuse it. Delete
the folder to measure again.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from vllm_srun.adapters.engines.cpu_onednn import PACK_HINT, PackedEncoder
from vllm_srun.adapters.models.reference_encoder import ReferenceEncoder
from vllm_srun.domain.worker.kernels import DEFAULT_TIE, KernelTiming, bucket_rows, timing_grid

FORMAT = 4  # 4: the packed side runs on rows padded once (the serving forward pads once, not per linear)
# the largest forward timed at load (tokens): past it the packed copies were measured no faster
# (0.88-0.92x at 2,560-4,096 tokens on a 2-core AVX2 EPYC, docs research), so eager serves them
TIMED_UP_TO = 2048
Progress = Callable[[str], None]


def timed_sizes(largest: int) -> list[int]:
    """Row counts to time: the doubling grid up to LARGEST (at most TIMED_UP_TO), each moved to
    the middle of its bucket's padding (a power of two plus about 1/32) so the timing pays the
    padding an average forward pays."""
    sizes = []
    largest = min(largest, TIMED_UP_TO)
    for size in timing_grid(largest):
        mid = size + size // 32 + 1
        sizes.append(mid if bucket_rows(mid) != mid and mid <= largest else size)
    return sizes


def time_linears(
    reference: ReferenceEncoder,
    packed: PackedEncoder,
    sizes: Sequence[int],
    clock: Callable[[], float] = time.perf_counter,
) -> list[KernelTiming]:
    """One layer's linears (+ activation) for each count of token rows, eager on the rows vs
    packed on the same rows padded to their bucket once, outside the timing (as the serving
    forward pads them: `PackedRows.build(pad_to=bucket_rows)`), in back-to-back pairs (ABBA). The speedup is the median of the pairs' ratios: other processes on
    a shared CPU come and go, and a pair sees the same load, so its ratio stays fair while the
    times themselves swing. A size that looks lost is timed again and judged on both samples.
    Stops after the first size where the packed copies are measurably slower (the plan ends there).
    Each timing's `fast_s` is `eager_s` (median) ÷ that median ratio."""
    layer, fast = reference.encoder.blocks[0], packed.layers[0]
    hidden, inner, attended = layer.qkv.in_features, layer.ffn_out.in_features, layer.attn_out.in_features
    gen = torch.Generator().manual_seed(0)

    def eager(x: torch.Tensor, f: torch.Tensor) -> None:
        a = x if attended == hidden else f[:, :attended]  # the attention's width (heads × head size)
        layer.qkv(x), layer.attn_out(a), layer.activate(layer.ffn_in(x)), layer.ffn_out(f[:, :inner])

    def packed_run(x: torch.Tensor, f: torch.Tensor) -> None:  # X, F already a bucket's rows
        a = x if attended == hidden else f[:, :attended]
        fast.qkv.rows(x), fast.attn_out.rows(a), fast.ffn_in.rows(x), fast.ffn_out.rows(f[:, :inner])

    def padded(t: torch.Tensor) -> torch.Tensor:
        return torch.cat([t, t.new_zeros(bucket_rows(t.shape[0]) - t.shape[0], t.shape[1])])

    def pairs(x: torch.Tensor, f: torch.Tensor, reps: int) -> list[tuple[float, float]]:
        xp, fp = padded(x), padded(f)
        out = []
        for rep in range(reps):
            t = {}
            for which in (0, 1) if rep % 2 == 0 else (1, 0):
                start = clock()
                eager(x, f) if which == 0 else packed_run(xp, fp)
                t[which] = clock() - start
            out.append((t[0], t[1]))
        return out

    out: list[KernelTiming] = []
    with torch.inference_mode():
        for rows in sizes:
            x, f = torch.randn(rows, hidden, generator=gen), torch.randn(rows, max(inner, attended), generator=gen)
            x, f = x.to(packed.dtype), f.to(packed.dtype)
            eager(x, f)  # warm both (oneDNN builds its primitive for this shape)
            packed_run(padded(x), padded(f))
            reps = max(3, min(9, 2048 // rows))  # about 1 s in all for MiniLM on 2 quiet cores
            sample = pairs(x, f, reps)
            timing = _timing(rows, sample)
            if timing.speedup < DEFAULT_TIE:  # a loss ends the plan: make sure it is one
                timing = _timing(rows, sample + pairs(x, f, reps))
            out.append(timing)
            if timing.speedup < DEFAULT_TIE:
                break
    return out


def _timing(rows: int, sample: list[tuple[float, float]]) -> KernelTiming:
    eager_s = statistics.median(e for e, _ in sample)
    ratio = statistics.median(e / p if p > 0 else 1.0 for e, p in sample)
    return KernelTiming(rows, eager_s, eager_s / ratio if ratio > 0 else float("inf"))


@lru_cache(maxsize=1)
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def timing_key(reference: ReferenceEncoder, sizes: Sequence[int]) -> dict[str, Any]:
    """What the timings depend on: machine, threads, kernels' versions, layer shapes, grid."""
    layer = reference.encoder.blocks[0]
    return {
        "format": FORMAT,
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "dtype": str(next(reference.encoder.parameters()).dtype).removeprefix("torch."),
        "torch": torch.__version__,
        "pack_hint": PACK_HINT,
        "hidden": layer.qkv.in_features,
        "inner": layer.ffn_out.in_features,
        "act": reference.config.hidden_act,
        "qkv": layer.qkv.out_features,
        "ffn_in": layer.ffn_in.out_features,
        "glu": layer.glu,
        "sizes": list(sizes),
    }


def _path(cache_dir: Path, key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    return cache_dir / "kernels" / f"onednn-{digest}.json"


def _read(path: Path, key: dict[str, Any]) -> list[KernelTiming] | None:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        if doc.get("key") != key:
            return None
        return [KernelTiming(int(t), float(e), float(f)) for t, e, f in doc["timings"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write(path: Path, key: dict[str, Any], timings: list[KernelTiming]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        doc = {"key": key, "timings": [[t.tokens, t.eager_s, t.fast_s] for t in timings]}
        tmp.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache only costs the next start another measurement


def measure(
    reference: ReferenceEncoder, packed: PackedEncoder, largest: int, cache_dir: Path | None, progress: Progress
) -> tuple[list[KernelTiming], str]:
    """(timings, `cached` or `measured`) for REFERENCE's layer shapes on this machine."""
    sizes = timed_sizes(largest)
    key = timing_key(reference, sizes)
    path = _path(Path(cache_dir), key) if cache_dir is not None else None
    if path is not None:
        found = _read(path, key)
        if found:
            return found, "cached"
    progress(f"load: timing oneDNN packed vs eager linears at {sizes} token rows")
    timings = time_linears(reference, packed, sizes)
    if path is not None:
        _write(path, key, timings)
    return timings, "measured"
