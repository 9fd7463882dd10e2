"""CPU thread budget of a worker (R-CPU-1), the standalone default, the OpenMP wait policy, and
parsers for where the budget comes from. The adapter reads `/sys/fs/cgroup/cpu.max` (v2) or `cpu.cfs_quota_us` and
`cpu.cfs_period_us` (v1) and the process affinity; these functions only parse and decide.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

MAX_WORKER_THREADS = 16
THREADS_ENV = "VLLM_SRUN_CPU_THREADS"


class InvalidThreadOverride(ValueError):
    """`VLLM_SRUN_CPU_THREADS` is set to something other than a positive integer."""


def worker_threads(budget_cpus: float, env_override: str | None) -> int:
    """Threads for one managed CPU worker.

    Without an override: half the budget rounded down, at least 1, at most 16. With
    `VLLM_SRUN_CPU_THREADS=N` (a positive integer): N, capped by the budget (whole CPUs,
    at least 1) but not by 16. An empty or blank value counts as unset.
    """
    if not math.isfinite(budget_cpus) or budget_cpus <= 0:
        raise ValueError(f"CPU budget must be a positive number of CPUs, got {budget_cpus!r}")
    if env_override is not None and env_override.strip():
        requested = parse_thread_override(env_override)
        return min(requested, max(1, math.floor(budget_cpus)))
    return max(1, min(MAX_WORKER_THREADS, math.floor(budget_cpus / 2)))


def parse_thread_override(text: str) -> int:
    value = text.strip()
    if not (value.isascii() and value.isdigit()) or int(value) < 1:
        raise InvalidThreadOverride(
            f"{THREADS_ENV} must be a positive integer (a thread count per CPU worker), got {text!r}"
        )
    return int(value)


def cpu_budget(quota_cpus: float | None, affinity_cpus: int) -> float:
    """The CPUs the front may use: the cgroup quota when there is one, never more than the
    CPUs the process may run on."""
    if affinity_cpus < 1:
        raise ValueError("affinity must allow at least one CPU")
    if quota_cpus is None:
        return float(affinity_cpus)
    return min(quota_cpus, float(affinity_cpus))


def parse_cgroup_v2_cpu_max(text: str) -> float | None:
    """`cpu.max` is "QUOTA PERIOD" in microseconds, or "max PERIOD" for no limit.

    Returns the quota in CPUs (e.g. "150000 100000" → 1.5), or None when unlimited.
    """
    fields = text.split()
    if not fields or len(fields) > 2:
        raise ValueError(f"cpu.max: expected 'QUOTA PERIOD', got {text!r}")
    if fields[0] == "max":
        return None
    period = fields[1] if len(fields) == 2 else "100000"  # the kernel's default period
    return _quota_cpus(fields[0], period, source="cpu.max")


def parse_cgroup_v1_cpu_quota(quota_text: str, period_text: str) -> float | None:
    """`cpu.cfs_quota_us` (-1 = unlimited) over `cpu.cfs_period_us`, in CPUs."""
    if quota_text.strip() == "-1":
        return None
    return _quota_cpus(quota_text.strip(), period_text.strip(), source="cpu.cfs_quota_us")


def parse_cpu_list(text: str) -> int:
    """How many CPUs a list such as "0-3,8,10-11" (cpuset.cpus.effective) names."""
    count = 0
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        try:
            first, last = int(low), int(high or low)
        except ValueError:
            raise ValueError(f"CPU list: cannot read {part!r} in {text!r}") from None
        if first < 0 or last < first:
            raise ValueError(f"CPU list: bad range {part!r} in {text!r}")
        count += last - first + 1
    if count == 0:
        raise ValueError(f"CPU list names no CPU: {text!r}")
    return count


def _quota_cpus(quota: str, period: str, *, source: str) -> float:
    try:
        quota_us, period_us = int(quota), int(period)
    except ValueError:
        raise ValueError(f"{source}: expected integers, got {quota!r} and {period!r}") from None
    if quota_us <= 0 or period_us <= 0:
        raise ValueError(f"{source}: quota and period must be positive, got {quota!r} {period!r}")
    return quota_us / period_us


def standalone_threads(budget_cpus: float) -> int:
    """Default forward threads of a `vllm-srun serve` started by hand: the whole CPU budget it may
    run on (whole CPUs of its cgroup quota and affinity), at least 1.

    Measured with `wrk` (a client that takes almost no CPU from the server) on 2 CPUs, MiniLM at
    2 threads served about twice the requests of 1 thread (bench/threads.py). A worker that shares
    its cores with other busy processes keeps that only with passive OpenMP waits
    (`omp_wait_policy`); the front's managed workers keep R-CPU-1's half of the budget.
    """
    if not math.isfinite(budget_cpus) or budget_cpus <= 0:
        raise ValueError(f"CPU budget must be a positive number of CPUs, got {budget_cpus!r}")
    return max(1, math.floor(budget_cpus))


def budget_threads(budget_cpus: float) -> int:
    """The most forward threads a worker may be given: the budget's whole CPUs, at least 1."""
    return standalone_threads(budget_cpus)


def threads_refusal(threads: int | None, budget_cpus: float) -> str | None:
    """Why `--threads N` cannot run here (one line), or None: more threads than the CPUs this
    process may run on only make an OpenMP team wait for its own members."""
    if threads is None:
        return None
    most = budget_threads(budget_cpus)
    if threads > most:
        return (
            f"--threads {threads} is above this process's CPU budget of {most} CPU(s) "
            "(its affinity and cgroup quota); use at most that"
        )
    return None


def concurrent_forwards_refusal(concurrent: int, threads: int, adaptive: bool) -> str | None:
    """Why `--concurrent-forwards N` cannot run with THREADS forward threads (one line), or None.

    The forwards split the threads evenly (each runs on its own team of THREADS ÷ N), so N must
    divide THREADS; adaptive threads time one forward at a time against another count, so they
    need N = 1."""
    if concurrent < 1:
        return f"--concurrent-forwards must be at least 1, got {concurrent}"
    if concurrent == 1:
        return None
    if adaptive:
        return f"--concurrent-forwards {concurrent}: adaptive threads time one forward at a time (use 1)"
    if threads % concurrent:
        return (
            f"--concurrent-forwards {concurrent} does not divide the {threads} forward thread(s) "
            "(each forward runs on threads ÷ N)"
        )
    return None


@dataclass(frozen=True, slots=True)
class CpuPlan:
    """How a worker's forwards use its CPUs, decided once before the engine loads."""

    team: int  # OpenMP threads of one forward
    concurrent: int  # forwards side by side, each on its own team
    cpu_budget: int  # whole CPUs the worker may run on
    wait_policy: str | None  # the OpenMP wait policy to set before torch loads (None: leave it)
    forward_nice: int  # the forward threads' nice increment over the event loop's


def default_concurrent_forwards(threads: int, adaptive: bool) -> int:
    """Forwards a CPU worker runs side by side when `--concurrent-forwards` is not given: 2 when
    the THREADS split evenly into two teams, else 1; 1 with adaptive threads (they time one
    forward at a time).

    Measured with `wrk` on 2 CPUs (MiniLM, 64 connections, bench/threads.py and bench/peers.py):
    one team of 2 left the machine about 25 % idle under load (every parallel region wakes the
    passive member that slept at the last barrier); two teams of 1 served 1.35-1.99x the short
    and 1.11-1.57x the mixed requests of one team of 2 over five runs. Two teams halve each
    team's barriers while one forward's Python between kernels overlaps the other's kernels; a
    lone request runs on half the threads, which for forwards this small costs less than the
    barrier it saves (its p50 was 6.9-9.6 ms against 11.1-12.0 ms for one team of 2).
    """
    if adaptive or threads < 2 or threads % 2:
        return 1
    return 2


EXPRESS_ENV = "VLLM_SRUN_EXPRESS_FORWARD"


def switch_on(env: Mapping[str, str], name: str) -> bool:
    """A switch that is on unless NAME is 0/off/false/no (unset, 1/on/true/yes: on). Raises ValueError
    with a one-line reason for anything else."""
    raw = env.get(name, "").strip().lower()
    if raw in ("", "1", "on", "true", "yes"):
        return True
    if raw in ("0", "off", "false", "no"):
        return False
    raise ValueError(f"{name} must be 1/on or 0/off, got {env[name]!r}")


def express_forward(env: Mapping[str, str]) -> bool:
    """Whether a CPU worker with concurrent forwards runs express forwards beside its busy slots
    (R-FAIR-7, R-BAT-6): `VLLM_SRUN_EXPRESS_FORWARD` (`switch_on`)."""
    return switch_on(env, EXPRESS_ENV)


LANE_YIELD_ENV = "VLLM_SRUN_LANE_YIELD"


def lane_yield(env: Mapping[str, str]) -> bool:
    """Whether a slot's forward of a costlier lane pauses at its yield points while a lane express
    forward runs (R-BAT-6, `adapters/lane_yield.py`): `VLLM_SRUN_LANE_YIELD` (`switch_on`)."""
    return switch_on(env, LANE_YIELD_ENV)


# the forward threads run this much below the event loop's CPU priority (a nice increment)
FORWARD_NICE_ENV = "VLLM_SRUN_FORWARD_NICE"
DEFAULT_FORWARD_NICE = 5
MAX_NICE = 19


def forward_nice(env: Mapping[str, str]) -> int:
    """How far below the rest of the worker the forward threads' CPU priority is: a nice
    increment, `VLLM_SRUN_FORWARD_NICE` (0..19; 0 keeps one priority for every thread), default 5.

    With forwards on every core, the event loop (HTTP, `/health`) and the preparation threads
    compete with the forwards for the CPUs; at an equal priority the loop waits for a time slice
    while it has work, which is the latency a probe or a lone request sees and the gap in which
    the next batch is not formed. A forward loses nothing it would not lose to that work anyway:
    the loop's work is short and a nice increment only orders who runs first when both are ready.
    Measured on 2 CPUs under 64 connections of mixed texts, two concurrent forwards at nice 0
    against 5: `/health` p99 20.4 -> 10.1, 6.9 -> 6.0 and 8.6 -> 7.1 ms in three runs (one thread
    at nice 0: 17.0, 5.8 and 5.2 ms), throughput within noise (bench/threads.py).
    Raises ValueError with a one-line reason for a value that is not an integer in 0..19.
    """
    return nice_increment(env, FORWARD_NICE_ENV, DEFAULT_FORWARD_NICE)


def nice_increment(env: Mapping[str, str], name: str, default: int) -> int:
    """The nice increment (0..19) the variable NAME of ENV sets, DEFAULT when it is unset or empty;
    ValueError with a one-line reason for anything else (`forward_nice`, the media workers')."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_NICE:
        raise ValueError(f"{name} must be an integer from 0 to {MAX_NICE}, got {raw!r}")
    return value


# GNU OpenMP reads its wait policy once, when the library loads (torch's import)
WAIT_POLICY_ENV = "OMP_WAIT_POLICY"
OMP_THREADS_ENV = "OMP_NUM_THREADS"  # ... and the thread count a new thread starts with
SPIN_COUNT_ENV = "GOMP_SPINCOUNT"


def omp_wait_policy(threads: int, env: Mapping[str, str]) -> str | None:
    """The OpenMP wait policy a worker sets for its forwards, or None to leave it alone.

    With more than one forward thread: `PASSIVE` (a team member that finished its share sleeps at
    the barrier instead of spinning), unless the environment already says how to wait
    (`OMP_WAIT_POLICY` or `GOMP_SPINCOUNT`). Spinning members take the cores the late member, the
    event loop and other processes need: on 2 shared CPUs (load average 4-5), MiniLM at 2 threads
    served 23 req/s spinning and 116-132 passive (1 thread: 120-190; bench/threads.py prints both).
    One thread has no team, so nothing to set.
    """
    if threads <= 1:
        return None
    if env.get(WAIT_POLICY_ENV, "").strip() or env.get(SPIN_COUNT_ENV, "").strip():
        return None
    return "PASSIVE"


MAX_PREPARATION_THREADS = 4


def preparation_threads(forward_threads: int) -> int:
    """Threads that prepare large requests (decode bodies, tokenize, cut windows) off the event
    loop: a quarter of the forward threads, at least 1, at most 4, so preparation never takes
    more than a small share of the CPUs the forwards run on (R-CPU-1; docs/hardening.md)."""
    return max(1, min(MAX_PREPARATION_THREADS, forward_threads // 4))
