"""R-CPU-1: threads per managed CPU worker, and the cgroup/cpuset parsers behind the budget."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vllm_srun.domain.worker.threads import (
    DEFAULT_FORWARD_NICE,
    EXPRESS_ENV,
    FORWARD_NICE_ENV,
    LANE_YIELD_ENV,
    InvalidThreadOverride,
    concurrent_forwards_refusal,
    cpu_budget,
    default_concurrent_forwards,
    express_forward,
    forward_nice,
    lane_yield,
    omp_wait_policy,
    parse_cgroup_v1_cpu_quota,
    parse_cgroup_v2_cpu_max,
    parse_cpu_list,
    standalone_threads,
    threads_refusal,
    worker_threads,
)


@pytest.mark.parametrize(
    ("budget", "threads"),
    [
        (0.5, 1),
        (1, 1),
        (1.5, 1),
        (2, 1),
        (3.9, 1),
        (4, 2),
        (7, 3),
        (8, 4),
        (31, 15),
        (32, 16),
        (33, 16),
        (256, 16),
    ],
)
def test_half_the_budget_rounded_down_at_least_one_at_most_sixteen(budget: float, threads: int) -> None:
    assert worker_threads(budget, None) == threads


@pytest.mark.parametrize(
    ("budget", "override", "threads"),
    [
        (64, "8", 8),
        (64, "32", 32),
        (4, "8", 4),
        (2.5, "3", 2),
        (0.5, "4", 1),
        (8, " 6 ", 6),
        (8, "", 4),
        (8, "  ", 4),
    ],
)
def test_a_positive_override_is_capped_by_the_budget_only(budget: float, override: str, threads: int) -> None:
    assert worker_threads(budget, override) == threads


@pytest.mark.parametrize("override", ["0", "-2", "abc", "1.5", "8 threads", "٣", "+4", "0x10"])
def test_an_invalid_override_is_refused_naming_the_variable(override: str) -> None:
    with pytest.raises(InvalidThreadOverride, match="VLLM_SRUN_CPU_THREADS must be a positive integer"):
        worker_threads(8, override)


@pytest.mark.parametrize("budget", [0, -1, float("nan"), float("inf")])
def test_a_budget_must_be_a_positive_number(budget: float) -> None:
    with pytest.raises(ValueError):
        worker_threads(budget, None)


@given(st.floats(0.01, 4096), st.one_of(st.none(), st.integers(1, 1000).map(str)))
def test_threads_never_exceed_the_budget_or_fall_below_one(budget: float, override: str | None) -> None:
    threads = worker_threads(budget, override)
    assert 1 <= threads <= max(1, int(budget))
    if override is None:
        assert threads <= 16


def test_cgroup_v2_cpu_max() -> None:
    assert parse_cgroup_v2_cpu_max("max 100000\n") is None
    assert parse_cgroup_v2_cpu_max("max") is None
    assert parse_cgroup_v2_cpu_max("150000 100000\n") == 1.5
    assert parse_cgroup_v2_cpu_max("800000 100000") == 8.0
    assert parse_cgroup_v2_cpu_max("50000") == 0.5  # the kernel's default period
    for bad in ["", "abc 100000", "100000 0", "-1 100000", "1 2 3"]:
        with pytest.raises(ValueError):
            parse_cgroup_v2_cpu_max(bad)


def test_cgroup_v1_quota_and_period() -> None:
    assert parse_cgroup_v1_cpu_quota("-1\n", "100000\n") is None
    assert parse_cgroup_v1_cpu_quota("200000\n", "100000\n") == 2.0
    assert parse_cgroup_v1_cpu_quota("25000", "50000") == 0.5
    with pytest.raises(ValueError):
        parse_cgroup_v1_cpu_quota("x", "100000")


def test_cpu_list_and_budget() -> None:
    assert parse_cpu_list("0-3,8,10-11\n") == 7
    assert parse_cpu_list("5") == 1
    for bad in ["", "3-1", "a-b"]:
        with pytest.raises(ValueError):
            parse_cpu_list(bad)
    assert cpu_budget(None, 12) == 12.0
    assert cpu_budget(2.5, 12) == 2.5  # the container quota binds
    assert cpu_budget(64.0, 12) == 12.0  # never more than the CPUs it may run on
    assert worker_threads(cpu_budget(parse_cgroup_v2_cpu_max("400000 100000"), 64), None) == 2


def test_standalone_threads_use_the_whole_budget() -> None:
    assert [standalone_threads(b) for b in (0.5, 1, 2, 2.5, 8, 64)] == [1, 1, 2, 2, 8, 64]
    with pytest.raises(ValueError):
        standalone_threads(0)


def test_a_thread_count_above_the_budget_is_refused_in_one_line() -> None:
    assert threads_refusal(None, 2) is None
    assert threads_refusal(2, 2.5) is None
    refusal = threads_refusal(3, 2.5)
    assert refusal is not None and "--threads 3" in refusal and "2 CPU(s)" in refusal and "\n" not in refusal
    assert threads_refusal(1, 0.5) is None  # a budget under one CPU still runs one thread


def test_passive_openmp_waits_with_a_team_unless_the_environment_says_otherwise() -> None:
    assert omp_wait_policy(1, {}) is None  # one thread: no team, nothing waits
    assert omp_wait_policy(2, {}) == "PASSIVE"
    assert omp_wait_policy(8, {"OMP_WAIT_POLICY": "active"}) is None
    assert omp_wait_policy(8, {"GOMP_SPINCOUNT": "10000"}) is None
    assert omp_wait_policy(8, {"OMP_WAIT_POLICY": " "}) == "PASSIVE"


def test_concurrent_forwards_must_divide_the_threads_and_exclude_adaptive_threads() -> None:
    assert concurrent_forwards_refusal(1, 1, adaptive=False) is None
    assert concurrent_forwards_refusal(1, 8, adaptive=True) is None  # one at a time: adaptive may learn
    assert concurrent_forwards_refusal(2, 2, adaptive=False) is None
    assert concurrent_forwards_refusal(4, 8, adaptive=False) is None
    assert "does not divide the 8" in (concurrent_forwards_refusal(3, 8, adaptive=False) or "")
    assert "does not divide the 1" in (concurrent_forwards_refusal(2, 1, adaptive=False) or "")
    assert "adaptive threads" in (concurrent_forwards_refusal(2, 2, adaptive=True) or "")
    assert "at least 1" in (concurrent_forwards_refusal(0, 2, adaptive=False) or "")


def test_the_default_runs_two_forwards_when_the_threads_split_evenly() -> None:
    assert default_concurrent_forwards(2, adaptive=False) == 2  # two teams of one (bench/threads.py)
    assert default_concurrent_forwards(8, adaptive=False) == 2
    assert default_concurrent_forwards(16, adaptive=False) == 2
    assert default_concurrent_forwards(1, adaptive=False) == 1
    assert default_concurrent_forwards(3, adaptive=False) == 1  # uneven teams: one at a time
    assert default_concurrent_forwards(2, adaptive=True) == 1  # adaptive threads time one at a time
    for threads in range(1, 33):  # whatever it picks is never refused
        for adaptive in (False, True):
            picked = default_concurrent_forwards(threads, adaptive)
            assert concurrent_forwards_refusal(picked, threads, adaptive) is None


@pytest.mark.parametrize(
    ("value", "nice"), [(None, DEFAULT_FORWARD_NICE), ("", DEFAULT_FORWARD_NICE), ("0", 0), (" 19 ", 19)]
)
def test_the_forward_threads_nice_increment(value: str | None, nice: int) -> None:
    assert forward_nice({} if value is None else {FORWARD_NICE_ENV: value}) == nice


@pytest.mark.parametrize(
    ("value", "on"), [(None, True), ("", True), ("1", True), (" On ", True), ("0", False), ("off", False)]
)
def test_the_express_forward_is_on_unless_turned_off(value: str | None, on: bool) -> None:
    assert express_forward({} if value is None else {EXPRESS_ENV: value}) is on
    with pytest.raises(ValueError, match=f"^{EXPRESS_ENV} must be 1/on or 0/off, got 'maybe'$"):
        express_forward({EXPRESS_ENV: "maybe"})


@pytest.mark.parametrize(("value", "on"), [(None, True), ("1", True), ("on", True), ("0", False), ("off", False)])
def test_the_lane_yield_is_on_unless_turned_off(value: str | None, on: bool) -> None:
    assert lane_yield({} if value is None else {LANE_YIELD_ENV: value}) is on
    with pytest.raises(ValueError, match=f"^{LANE_YIELD_ENV} must be 1/on or 0/off, got 'maybe'$"):
        lane_yield({LANE_YIELD_ENV: "maybe"})


@pytest.mark.parametrize("value", ["-1", "20", "high", "5.0"])
def test_a_bad_forward_nice_is_refused_naming_the_variable(value: str) -> None:
    with pytest.raises(ValueError) as caught:
        forward_nice({FORWARD_NICE_ENV: value})
    assert str(caught.value).startswith(FORWARD_NICE_ENV) and "0 to 19" in str(caught.value)
