"""Knee calibration (R-DEV-2), pure: synthetic cost curves timed by a fake device — monotone,
noisy, with a cliff, out of memory past some size — and the budget it keeps."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_srun.domain.settings.engine_args import EngineArgs, calibrated_limits, resolve_limits
from vllm_srun.domain.worker.calibration import (
    KNEE_TOLERANCE,
    MEMORY_SPARE,
    TIME_CAP_S,
    CalibrationFailed,
    Timed,
    calibrate,
    calibration_sizes,
    choose_budget,
    seconds_at,
    tokens_within,
)

BUDGETS = [4_096, 8_192, 16_384, 32_768]


@dataclass
class FakeGpu:
    """A device whose merged forward of T tokens takes `seconds(T)` (None: out of memory) and
    `bytes_per_token × T` bytes at its peak."""

    seconds: Callable[[int], float | None]
    bytes_per_token: int = 20_000
    timed: list[int] = field(default_factory=list)

    def measure(self, tokens: int) -> Timed:
        self.timed.append(tokens)
        s = self.seconds(tokens)
        return Timed(tokens, s, None if s is None else self.bytes_per_token * tokens)


def overhead_curve(overhead: float, per_token: float) -> Callable[[int], float]:
    return lambda t: overhead + per_token * t


curves = st.one_of(
    # monotone: a fixed launch cost plus a cost per token (cheaper per token as forwards grow)
    st.builds(overhead_curve, st.floats(0, 5e-3), st.floats(1e-8, 2e-5)).map(lambda f: ("monotone", f, None)),
    # noisy: the same, each timing off by up to ±5%
    st.tuples(st.floats(0, 5e-3), st.floats(1e-8, 2e-5), st.integers(0, 2**32)).map(
        lambda a: ("noisy", lambda t, o=a[0], b=a[1], s=a[2]: (o + b * t) * (1 + 0.05 * math.sin(s + t)), None)
    ),
    # a cliff: the cost per token doubles past some size (e.g. a kernel that stops fitting a cache)
    st.tuples(st.floats(1e-8, 2e-5), st.sampled_from([4_096, 8_192, 16_384])).map(
        lambda a: ("cliff", lambda t, b=a[0], c=a[1]: b * t * (1 if t <= c else 2), a[1])
    ),
    # out of memory past some size
    st.tuples(st.floats(1e-8, 2e-5), st.integers(1, 40_000)).map(
        lambda a: ("oom", lambda t, b=a[0], m=a[1]: None if t > m else 1e-3 + b * t, None)
    ),
)


@settings(max_examples=300, deadline=None)
@given(
    curve=curves,
    budget=st.sampled_from(BUDGETS),
    largest=st.integers(8, 300_000),
    free=st.one_of(st.none(), st.integers(10**8, 200 * 10**9)),
    bytes_per_token=st.integers(1_000, 2_000_000),
)
def test_the_budget_keeps_every_rule(
    curve: tuple[str, Callable[[int], float | None], int | None],
    budget: int,
    largest: int,
    free: int | None,
    bytes_per_token: int,
) -> None:
    _kind, seconds, cliff = curve
    gpu = FakeGpu(seconds, bytes_per_token)
    sizes = calibration_sizes(budget, largest)
    try:
        found = calibrate(gpu.measure, class_budget=budget, largest_forward=largest, free_bytes=free)
    except CalibrationFailed:
        assert gpu.timed == [sizes[0]] and seconds(sizes[0]) is None  # only when the first forward did not fit
        return
    timed = found.timings
    # what was timed: a prefix of the doubling sizes, nothing after an OOM, a slow forward or a predicted misfit
    assert gpu.timed == list(sizes[: len(gpu.timed)])
    for t in timed[:-1]:
        assert t.seconds is not None and t.seconds <= TIME_CAP_S
    ok = [t for t in timed if t.seconds is not None and t.seconds > 0]
    cheapest = min(t.per_token for t in ok)
    # the knee: the largest timed size within 2% of the cheapest cost per token
    assert found.knee_tokens == max(t.tokens for t in ok if t.per_token <= cheapest * (1 + KNEE_TOLERANCE))
    assert found.cheapest_seconds_per_token == cheapest
    n = found.tokens
    assert n % 8 == 0 and 8 <= n <= max(8, budget) and n <= found.knee_tokens
    assert n == 8 or seconds_at(ok, n) <= TIME_CAP_S * (1 + 1e-9)  # ≈0.3 s of work at most
    if free is not None:
        assert n == 8 or n * bytes_per_token <= (1 - MEMORY_SPARE) * free + 8 * bytes_per_token
    if found.out_of_memory_at is not None:
        assert n < found.out_of_memory_at
    assert found.seconds_per_token > 0 and found.card()["status"] == "calibrated"
    if cliff is not None:
        assert n <= max(cliff, ok[0].tokens)  # never past the cliff (unless the first size is past it)


def test_monotone_curve_keeps_the_class_budget() -> None:
    gpu = FakeGpu(overhead_curve(2e-3, 1e-6), bytes_per_token=1_000)
    found = calibrate(gpu.measure, class_budget=32_768, largest_forward=10**6, free_bytes=100 * 10**9)
    assert gpu.timed == [4_096, 8_192, 16_384, 32_768]
    assert (found.tokens, found.limited_by) == (32_768, "budget")


def test_a_cliff_keeps_the_size_before_it() -> None:
    gpu = FakeGpu(lambda t: 1e-6 * t * (1 if t <= 8_192 else 1.6))
    found = calibrate(gpu.measure, class_budget=32_768, largest_forward=10**6, free_bytes=None)
    assert (found.tokens, found.limited_by, found.knee_tokens) == (8_192, "knee", 8_192)


def test_within_two_percent_counts_as_the_knee() -> None:
    per_token = {4_096: 1.00e-6, 8_192: 0.99e-6, 16_384: 1.005e-6, 32_768: 1.03e-6}
    gpu = FakeGpu(lambda t: per_token[t] * t)
    found = calibrate(gpu.measure, class_budget=32_768, largest_forward=10**6, free_bytes=None)
    assert found.knee_tokens == 16_384 and found.tokens == 16_384  # 1.005 ≤ 0.99 × 1.02; 1.03 is not


def test_the_time_cap_binds_between_timed_sizes() -> None:
    """A slow model: a forward of 16,384 tokens already takes 0.32 s; the cap interpolates to ≈15,360."""
    gpu = FakeGpu(lambda t: 2e-5 * t * (1 - 0.01 * math.log2(t / 4_096)))
    found = calibrate(gpu.measure, class_budget=32_768, largest_forward=10**6, free_bytes=None)
    assert gpu.timed == [4_096, 8_192, 16_384]  # nothing past the first forward over 0.3 s
    assert found.limited_by == "time" and 14_000 < found.tokens < 16_384
    assert seconds_at(found.timings, found.tokens) <= TIME_CAP_S
    slow = FakeGpu(lambda t: 1e-4 * t)  # 0.41 s at the first size: below 4,096 tokens, by the same rule
    capped = calibrate(slow.measure, class_budget=32_768, largest_forward=10**6, free_bytes=None)
    assert slow.timed == [4_096] and capped.tokens == 3_000 and capped.limited_by == "time"


def test_free_memory_with_fifteen_percent_to_spare() -> None:
    gpu = FakeGpu(overhead_curve(1e-3, 1e-7), bytes_per_token=120_000)  # 120 kB per token
    found = calibrate(gpu.measure, class_budget=32_768, largest_forward=10**6, free_bytes=2 * 10**9)
    assert gpu.timed == [4_096, 8_192]  # 16,384 tokens would need 1.97 GB of the 1.7 GB usable: not timed
    assert found.memory_cap_tokens == 14_160 and (found.tokens, found.limited_by) == (8_192, "knee")
    tight = FakeGpu(overhead_curve(1e-3, 1e-7), bytes_per_token=250_000)  # 4,096 tokens already take 1.02 GB
    found = calibrate(tight.measure, class_budget=32_768, largest_forward=10**6, free_bytes=10**9)
    assert tight.timed == [4_096] and (found.tokens, found.limited_by) == (3_400, "memory")


def test_out_of_memory_ends_the_timing_and_bounds_the_budget() -> None:
    gpu = FakeGpu(lambda t: None if t > 10_000 else 1e-3 + 1e-7 * t)
    found = calibrate(gpu.measure, class_budget=32_768, largest_forward=10**6, free_bytes=None)
    assert gpu.timed == [4_096, 8_192, 16_384] and found.out_of_memory_at == 16_384 and found.tokens == 8_192
    with pytest.raises(CalibrationFailed, match="out of memory at 4096"):
        calibrate(FakeGpu(lambda t: None).measure, class_budget=32_768, largest_forward=10**6, free_bytes=None)


def test_sizes() -> None:
    assert calibration_sizes(32_768, 10**6) == (4_096, 8_192, 16_384, 32_768)
    assert calibration_sizes(4_096, 10**6) == (4_096,)
    assert calibration_sizes(16_384, 32 * 300) == (4_096, 8_192, 9_600)  # 32 rows of 300 tokens at most
    assert calibration_sizes(32_768, 1_000) == (1_000,)
    assert tokens_within([Timed(100, 1.0)], 0.5) == 50 and seconds_at([Timed(100, 1.0)], 300) == 3.0


def test_a_set_budget_is_never_calibrated() -> None:
    args = EngineArgs(max_num_batched_tokens=2_048)
    limits = resolve_limits(args, "cuda", 80 * 10**9)
    assert calibrated_limits(limits, 16_384) == limits and limits.tokens_source == "set"
    unset = resolve_limits(EngineArgs(), "cuda", 80 * 10**9)
    done = calibrated_limits(unset, 12_000)
    assert (done.max_num_batched_tokens, done.tokens_source, done.max_num_seqs) == (12_000, "calibrated", 128)


def test_choose_budget_needs_a_timing() -> None:
    with pytest.raises(CalibrationFailed, match="no forward was timed"):
        choose_budget([], class_budget=4_096, free_bytes=None)
