"""Knee calibration of the token budget on GPUs (R-DEV-2), and the cost per token it measures
(which seeds R-BAT-7's device-seconds cap).

After the readiness check a GPU worker times merged forwards from 4,096 tokens, doubling, up to
its memory class's budget (`calibration_sizes`), and keeps the largest budget whose cost per
token is within 2% of the cheapest timed: past that knee a bigger forward buys no throughput,
only latency. The budget is never more than one forward does in about 0.3 s (the timings,
interpolated), nor more than fits free device memory with 15% to spare (the largest memory per
token a timed forward took). Timing stops at the first forward that ran out of memory, took more
than 0.3 s, or whose memory per token says the next size would not fit (`stop_reason`).

Pure: the adapter (`adapters/serving/calibration.py`) times forwards on the device and hands
them in through `measure`; everything decided is decided here. A value the user set is never
calibrated (`engine_args.calibrated_limits`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from vllm_srun.domain.scheduling.lanes import TOKEN_ALIGN

START_TOKENS = 4096
TIME_CAP_S = 0.3
KNEE_TOLERANCE = 0.02
MEMORY_SPARE = 0.15


class CalibrationFailed(ValueError):
    """No forward could be timed (one line saying why); the class budget stays."""


@dataclass(frozen=True, slots=True)
class Timed:
    """One merged forward of `tokens` counted tokens, timed on the device."""

    tokens: int
    seconds: float | None  # None: it ran out of device memory
    peak_bytes: int | None = None  # device memory it took beyond what was allocated before it

    @property
    def ok(self) -> bool:
        return self.seconds is not None

    @property
    def per_token(self) -> float:
        if self.seconds is None:
            raise ValueError(f"the forward of {self.tokens} tokens ran out of memory: no cost per token")
        return self.seconds / self.tokens


@dataclass(frozen=True, slots=True)
class Calibration:
    tokens: int  # the calibrated max_num_batched_tokens
    limited_by: str  # knee | time | memory | budget: what decided it
    seconds_per_token: float  # cost per token of a forward of `tokens` (interpolated)
    cheapest_seconds_per_token: float
    knee_tokens: int
    time_cap_tokens: int
    memory_cap_tokens: int | None  # None: the device reports no free memory
    out_of_memory_at: int | None
    free_bytes: int | None
    timings: tuple[Timed, ...]

    def card(self) -> dict[str, Any]:
        """The card's `engine_args.calibration` figures."""
        return {
            "status": "calibrated",
            "max_num_batched_tokens": self.tokens,
            "limited_by": self.limited_by,
            "knee_tokens": self.knee_tokens,
            "time_cap_tokens": self.time_cap_tokens,
            "memory_cap_tokens": self.memory_cap_tokens,
            "out_of_memory_at": self.out_of_memory_at,
            "seconds_per_token": self.seconds_per_token,
            "cheapest_seconds_per_token": self.cheapest_seconds_per_token,
            "free_bytes": self.free_bytes,
            "timings": [{"tokens": t.tokens, "seconds": t.seconds, "peak_bytes": t.peak_bytes} for t in self.timings],
        }


def calibration_sizes(class_budget: int, largest_forward: int, start: int = START_TOKENS) -> tuple[int, ...]:
    """Forward sizes to time: START, doubling, up to the class budget (itself last). Never above
    LARGEST_FORWARD, the most a forward can hold (max_num_seqs rows of the longest input): a
    bigger budget could never be filled. Below START, that top size alone."""
    if class_budget < TOKEN_ALIGN or largest_forward < 1 or start < 1:
        raise ValueError(f"need a budget >= {TOKEN_ALIGN}, a forward >= 1, start >= 1")
    top = _align_down(min(class_budget, largest_forward))
    sizes: list[int] = []
    size = start
    while size < top:
        sizes.append(size)
        size *= 2
    sizes.append(top)
    return tuple(sizes)


def stop_reason(
    point: Timed,
    next_tokens: int | None,
    free_bytes: int | None,
    *,
    time_cap_s: float = TIME_CAP_S,
    spare: float = MEMORY_SPARE,
) -> str | None:
    """Why no larger forward is timed after POINT (None: time NEXT_TOKENS too)."""
    if point.seconds is None:
        return f"out of memory at {point.tokens} tokens"
    if point.seconds > time_cap_s:
        return f"{point.tokens} tokens took {point.seconds:.3f} s (> {time_cap_s:g} s)"
    if next_tokens is None:
        return None
    if free_bytes is not None and point.peak_bytes is not None:
        predicted = point.peak_bytes / point.tokens * next_tokens
        if predicted > (1 - spare) * free_bytes:
            return f"{next_tokens} tokens would need about {predicted / 1e9:.2f} GB of {free_bytes / 1e9:.2f} GB free"
    return None


def seconds_at(points: Sequence[Timed], tokens: int) -> float:
    """A forward's seconds at TOKENS, interpolated linearly between the timed POINTS (and the
    origin), extrapolated past the last at its cost per token."""
    ok = sorted((p for p in points if p.seconds is not None), key=lambda p: p.tokens)
    if not ok:
        raise ValueError("no timed forward")
    prev_t, prev_s = 0, 0.0
    for p in ok:
        assert p.seconds is not None
        if tokens <= p.tokens:
            return prev_s + (p.seconds - prev_s) * (tokens - prev_t) / (p.tokens - prev_t)
        prev_t, prev_s = p.tokens, p.seconds
    return prev_s + ok[-1].per_token * (tokens - prev_t)


def tokens_within(points: Sequence[Timed], seconds: float) -> int:
    """The most tokens one forward holds within SECONDS, on the interpolated timings."""
    ok = sorted((p for p in points if p.seconds is not None), key=lambda p: p.tokens)
    if not ok:
        raise ValueError("no timed forward")
    prev_t, prev_s = 0, 0.0
    for p in ok:
        assert p.seconds is not None
        if p.seconds > seconds:
            if p.seconds <= prev_s:  # pragma: no cover - prev_s <= seconds < p.seconds
                return prev_t
            return int(prev_t + (seconds - prev_s) * (p.tokens - prev_t) / (p.seconds - prev_s) + 1e-6)
        prev_t, prev_s = p.tokens, p.seconds
    return int(prev_t + (seconds - prev_s) / ok[-1].per_token + 1e-6)


def choose_budget(
    timings: Sequence[Timed],
    *,
    class_budget: int,
    free_bytes: int | None,
    time_cap_s: float = TIME_CAP_S,
    tolerance: float = KNEE_TOLERANCE,
    spare: float = MEMORY_SPARE,
) -> Calibration:
    """The calibrated token budget from TIMINGS (module doc); CalibrationFailed without any."""
    ok = [p for p in timings if p.seconds is not None and p.seconds > 0]
    oom = min((p.tokens for p in timings if p.seconds is None), default=None)
    if not ok:
        why = f"out of memory at {oom} tokens" if oom is not None else "no forward was timed"
        raise CalibrationFailed(f"calibration timed no forward ({why})")
    cheapest = min(p.per_token for p in ok)
    knee = max(p.tokens for p in ok if p.per_token <= cheapest * (1 + tolerance))
    by_time = _align_down(tokens_within(ok, time_cap_s))
    per_token_bytes = [p.peak_bytes / p.tokens for p in ok if p.peak_bytes is not None]
    by_memory = None
    if free_bytes is not None and per_token_bytes:
        by_memory = _align_down(int((1 - spare) * free_bytes / max(max(per_token_bytes), 1e-9)))
    caps = [("budget", _align_down(class_budget)), ("knee", knee), ("time", by_time)]
    if by_memory is not None:
        caps.append(("memory", by_memory))
    limited_by, tokens = min(caps, key=lambda cap: cap[1])  # ties: the first named
    return Calibration(
        tokens=tokens,
        limited_by=limited_by,
        seconds_per_token=seconds_at(ok, tokens) / tokens,
        cheapest_seconds_per_token=cheapest,
        knee_tokens=knee,
        time_cap_tokens=by_time,
        memory_cap_tokens=by_memory,
        out_of_memory_at=oom,
        free_bytes=free_bytes,
        timings=tuple(timings),
    )


def calibrate(
    measure: Callable[[int], Timed],
    *,
    class_budget: int,
    largest_forward: int,
    free_bytes: int | None,
    time_cap_s: float = TIME_CAP_S,
    tolerance: float = KNEE_TOLERANCE,
    spare: float = MEMORY_SPARE,
    start: int = START_TOKENS,
) -> Calibration:
    """Time forwards with MEASURE (tokens → Timed) over `calibration_sizes`, stopping as
    `stop_reason` says, then `choose_budget`."""
    sizes = calibration_sizes(class_budget, largest_forward, start)
    timings: list[Timed] = []
    for i, size in enumerate(sizes):
        point = measure(size)
        timings.append(point)
        upcoming = sizes[i + 1] if i + 1 < len(sizes) else None
        if stop_reason(point, upcoming, free_bytes, time_cap_s=time_cap_s, spare=spare) is not None:
            break
    return choose_budget(
        timings,
        class_budget=class_budget,
        free_bytes=free_bytes,
        time_cap_s=time_cap_s,
        tolerance=tolerance,
        spare=spare,
    )


def _align_down(n: int) -> int:
    """N rounded down to a multiple of 8, at least 8 (a budget below one row is no budget)."""
    return max(TOKEN_ALIGN, (n // TOKEN_ALIGN) * TOKEN_ALIGN)
