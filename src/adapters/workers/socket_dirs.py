"""The front's folder of worker sockets: created private (mode 0700) with a note of its owner
(`front.pid`: the front's pid and start time), removed at exit, and, when a front was killed
before it could remove its own, removed by the next front to start (docs/hardening.md).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger("vllm_srun.front")
PREFIX = "vllm-sr-"
OWNER_FILE = "front.pid"


def make_socket_dir(parent: str) -> str:
    """A new private folder under PARENT, noting this process as its owner."""
    folder = tempfile.mkdtemp(prefix=PREFIX, dir=parent)
    Path(folder, OWNER_FILE).write_text(f"{os.getpid()} {_start_time(os.getpid()) or ''}\n")
    return folder


def clean_stale_socket_dirs(parent: str) -> list[str]:
    """Remove this user's socket folders under PARENT whose front is gone; returns them."""
    removed: list[str] = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(PREFIX):
            continue
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat(follow_symlinks=False).st_uid != os.getuid():
                continue
            owner = Path(entry.path, OWNER_FILE).read_text().split()
        except (OSError, ValueError):
            continue  # no owner note (or not ours to read): leave it
        if owner and not _alive(owner):
            shutil.rmtree(entry.path, ignore_errors=True)
            log.info("removed %s, left by a front (pid %s) that is gone", entry.path, owner[0])
            removed.append(entry.path)
    return removed


def _alive(owner: list[str]) -> bool:
    """Whether the process of an owner note (`pid [start time]`) still runs."""
    try:
        pid = int(owner[0])
    except ValueError:
        return True  # unreadable: keep the folder
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process holds the pid
    noted = owner[1] if len(owner) > 1 else None
    now = _start_time(pid)
    return noted is None or now is None or noted == now  # a different start time: the pid was reused


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), None elsewhere."""
    with contextlib.suppress(OSError, IndexError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[19]
    return None
