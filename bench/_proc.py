"""Resident memory of a server as a whole: VmRSS of a process and of all its descendants (Linux /proc).

vLLM runs an API server, an engine core and a worker process; our front runs workers; summing the
tree counts every process a deployment of the server needs. Shared pages (the torch libraries
mapped by several processes) count once per process, as `ps` and a container's per-process view
would show them.
"""

from __future__ import annotations

from pathlib import Path


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # a process that ended while we read
        tree.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    return tree


def descendants(pid: int) -> list[int]:
    """PID and every process below it."""
    tree, out, todo = _children(), [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(tree.get(p, []))
    return out


def vm_rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_rss_mib(pid: int) -> tuple[float, int]:
    """(VmRSS summed over PID's process tree in MiB, how many processes)."""
    pids = descendants(pid)
    return sum(vm_rss_kib(p) for p in pids) / 1024, len(pids)
