"""The CPU budget the front may use (R-CPU-1): the container's quota (cgroup v2 `cpu.max`, or
v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`) capped by the process affinity. The parsing and
the thread rule live in `domain/worker/threads.py`; this module only reads the files.
"""

from __future__ import annotations

import os
from pathlib import Path

from vllm_srun.domain.worker.threads import (
    THREADS_ENV,
    cpu_budget,
    parse_cgroup_v1_cpu_quota,
    parse_cgroup_v2_cpu_max,
    worker_threads,
)

CGROUP_ROOT = Path("/sys/fs/cgroup")


def affinity_cpus() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def _own_cgroup_dirs(root: Path) -> list[Path]:
    """The cgroup v2 folder of this process (from /proc/self/cgroup), then the root."""
    found = []
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            hierarchy, _, rest = line.partition(":")
            controllers, _, path = rest.partition(":")
            if hierarchy == "0" and not controllers and path:
                found.append(root / path.lstrip("/"))
    except OSError:
        pass
    return found + [root]


def quota_cpus(root: Path = CGROUP_ROOT) -> float | None:
    """The CPU quota in CPUs, or None when there is none (or it cannot be read)."""
    for folder in _own_cgroup_dirs(root):
        try:
            return parse_cgroup_v2_cpu_max((folder / "cpu.max").read_text())
        except (OSError, ValueError):
            continue
    for v1 in (root / "cpu", root / "cpu,cpuacct"):
        try:
            quota = (v1 / "cpu.cfs_quota_us").read_text()
            period = (v1 / "cpu.cfs_period_us").read_text()
            return parse_cgroup_v1_cpu_quota(quota, period)
        except (OSError, ValueError):
            continue
    return None


def front_cpu_budget(root: Path = CGROUP_ROOT) -> float:
    return cpu_budget(quota_cpus(root), affinity_cpus())


def managed_worker_threads(env: dict[str, str] | None = None, root: Path = CGROUP_ROOT) -> int:
    """Threads for each managed CPU worker; raises InvalidThreadOverride on a bad override."""
    environ = os.environ if env is None else env
    return worker_threads(front_cpu_budget(root), environ.get(THREADS_ENV))
