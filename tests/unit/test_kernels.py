"""The per-shape kernel choice (R-DT-3 b) as a pure function of timings: synthetic timing curves in,
a plan out. Also the row buckets the packed kernels run and the timing grid."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vllm_srun.domain.worker.kernels import (
    DEFAULT_MIN_SPEEDUP,
    KernelPlan,
    KernelTiming,
    SizePlan,
    bucket_rows,
    plan_by_size,
    plan_kernels,
    timing_grid,
)


def curve(*speedups: float, start: int = 16) -> list[KernelTiming]:
    """Timings at start, 2·start, 4·start … with eager 1 s and the fast path 1/speedup s."""
    return [KernelTiming(start << i, 1.0, 1.0 / s) for i, s in enumerate(speedups)]


def test_fast_path_serves_up_to_the_last_size_it_won_without_a_loss_before() -> None:
    # like the research machine: 1.78x at 16 tokens, 1.09x at 512, slower from 2,048
    plan = plan_kernels(curve(1.78, 1.6, 1.4, 1.2, 1.15, 1.09, 1.05, 0.9, 0.88))
    assert plan.fast_up_to == 1024
    assert plan.use_fast(1) and plan.use_fast(1024) and not plan.use_fast(1025) and not plan.use_fast(4096)


def test_a_loss_ends_the_region_even_if_a_larger_size_wins_again() -> None:
    plan = plan_kernels(curve(1.5, 1.2, 0.8, 1.4, 1.4))
    assert plan.fast_up_to == 32 and not plan.use_fast(64) and not plan.use_fast(128)


def test_no_win_at_the_smallest_size_means_eager_everywhere() -> None:
    for speedups in ((1.0, 1.5, 1.5), (0.5,), (1.02, 1.2)):
        plan = plan_kernels(curve(*speedups))
        assert plan == KernelPlan(0) and not plan.enabled and not plan.use_fast(16)
    assert plan_kernels([]) == KernelPlan(0)


def test_past_the_largest_measured_size_eager_serves() -> None:
    plan = plan_kernels(curve(2.0, 2.0, 2.0))  # 16, 32, 64 all won
    assert plan.fast_up_to == 64 and not plan.use_fast(65)


def test_order_of_timings_does_not_matter() -> None:
    timings = curve(1.5, 1.3, 1.1, 0.9)
    assert plan_kernels(timings[::-1]) == plan_kernels(timings) == KernelPlan(64)


def test_a_tie_up_to_512_tokens_keeps_the_fast_path_for_exactness() -> None:
    # won small, then within 10 % of eager up to and past 512: the region covers the whole 512
    ties = [
        KernelTiming(n, 1.0, 1.0 / s)
        for n, s in ((17, 1.3), (34, 1.2), (67, 1.01), (133, 0.98), (265, 1.0), (529, 0.91), (1057, 1.1))
    ]
    assert plan_kernels(ties).fast_up_to == 34  # speed alone
    plan = plan_kernels(ties, exact_tokens=512)
    assert plan.fast_up_to == 512 and plan.covers(512) and not plan.use_fast(513)
    # a real loss below 512 (not a tie) gives no such benefit
    lost = [*ties[:3], KernelTiming(133, 1.0, 1.0 / 0.85), *ties[4:]]
    assert plan_kernels(lost, exact_tokens=512).fast_up_to == 34
    # nor does a tie that was never measured as far as 512
    assert plan_kernels(ties[:5], exact_tokens=512).fast_up_to == 34
    # nor a fast path that never won
    flat = [KernelTiming(n, 1.0, 1.0) for n in (16, 64, 256, 1024)]
    assert plan_kernels(flat, exact_tokens=512) == KernelPlan(0)
    # a region already past 512 stays where speed put it
    assert plan_kernels(curve(1.5, 1.5, 1.5, 1.5, 1.5, 1.5, 1.5), exact_tokens=512).fast_up_to == 1024


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError):
        plan_kernels(curve(1.5), min_speedup=0)
    with pytest.raises(ValueError):
        plan_kernels([KernelTiming(0, 1.0, 0.5)])
    with pytest.raises(ValueError):
        bucket_rows(0)
    with pytest.raises(ValueError):
        timing_grid(0)


def test_speedup_of_a_zero_time() -> None:
    assert KernelTiming(8, 1.0, 0.0).speedup == float("inf")
    assert KernelTiming(8, 0.0, 0.0).speedup == 1.0


def test_timing_grid() -> None:
    assert timing_grid(4096) == (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
    assert timing_grid(300) == (16, 32, 64, 128, 256, 300)
    assert timing_grid(8) == (8,)
    assert timing_grid(1024, smallest=16, factor=4) == (16, 64, 256, 1024)


@given(st.integers(min_value=1, max_value=20_000))
def test_bucket_rows_pads_a_little_to_a_few_shapes(rows: int) -> None:
    b = bucket_rows(rows)
    assert b >= max(rows, 2)
    if rows > 16:
        assert b % 8 == 0 and b - rows < max(8, rows / 16)
    else:
        assert b == max(rows, 2)
    assert bucket_rows(b) == b  # a bucket is its own bucket


def test_bucket_rows_is_monotone_and_bounded() -> None:
    buckets = [bucket_rows(n) for n in range(1, 4097)]
    assert buckets == sorted(buckets)
    assert len(set(buckets)) <= 120  # oneDNN builds a primitive per shape: keep the set small


@given(
    st.lists(st.tuples(st.integers(1, 1 << 16), st.floats(0.2, 5.0)), min_size=1, max_size=8, unique_by=lambda t: t[0])
)
def test_a_gpu_kernel_serves_only_sizes_covered_by_a_measured_win(points: list[tuple[int, float]]) -> None:
    """R-DT-3 on GPUs (`plan_by_size`): a forward of T tokens takes the fast kernel exactly when the
    smallest measured size >= T was measurably faster; never past the largest size measured."""
    timings = [KernelTiming(tokens, 1.0, 1.0 / speedup) for tokens, speedup in points]
    plan = plan_by_size(timings)
    ordered = sorted(timings, key=lambda t: t.tokens)
    for probe in {1, *(t.tokens for t in ordered), *(t.tokens + 1 for t in ordered)}:
        covering = next((t for t in ordered if t.tokens >= probe), None)
        want = covering is not None and covering.speedup >= DEFAULT_MIN_SPEEDUP
        assert plan.use_fast(probe) == want
    assert plan.enabled == any(t.speedup >= DEFAULT_MIN_SPEEDUP for t in ordered)
    for low, high in plan.fast_ranges():
        assert plan.use_fast(low) and plan.use_fast(high) and not plan.use_fast(high + 1)
        assert low == 1 or not plan.use_fast(low - 1)


def test_size_plan_edges() -> None:
    plan = plan_by_size([KernelTiming(64, 1.0, 2.0), KernelTiming(256, 1.0, 0.5), KernelTiming(1024, 1.0, 0.5)])
    assert [plan.use_fast(t) for t in (1, 64, 65, 1024, 1025)] == [False, False, True, True, False]
    assert plan.switch_tokens == 64 and plan.fast_ranges() == [(65, 1024)]
    assert SizePlan().switch_tokens is None and not SizePlan().enabled
    with pytest.raises(ValueError, match="same size"):
        plan_by_size([KernelTiming(64, 1.0, 1.0), KernelTiming(64, 1.0, 2.0)])
