"""Finding and reloading a running `vllm-sr serve` (R-REP-2): its pid file and `vllm-sr reload`.

The pid file holds `{"pid", "host", "port"}` as JSON. Its default place is per port, in a
folder only this user may use: `$XDG_RUNTIME_DIR/vllm-sr/<port>.json`, else
`<tmp>/vllm-sr-<uid>/<port>.json`. The front writes it once it listens and removes it when it
exits. `reload_front` checks that the process is alive and answers on that port as that pid
(its inventory's `pid`) before it sends SIGHUP, so a stale file never signals a stranger; then
it waits for the inventory's `reload.generation` to move on and returns that reload's outcome.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

POLL_S = 0.2


@dataclass(frozen=True)
class FrontRecord:
    pid: int
    host: str
    port: int

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


def default_pid_file(port: int, env: dict[str, str] | None = None) -> Path:
    env = dict(os.environ) if env is None else env
    runtime = env.get("XDG_RUNTIME_DIR")
    folder = Path(runtime) / "vllm-sr" if runtime else Path(tempfile.gettempdir()) / f"vllm-sr-{os.getuid()}"
    return folder / f"{port}.json"


def write_pid_file(path: Path, record: FrontRecord) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.{record.pid}")
    staging.write_text(json.dumps({"pid": record.pid, "host": record.host, "port": record.port}), encoding="utf-8")
    staging.replace(path)


def read_pid_file(path: Path) -> FrontRecord:
    """The record in PATH; raises OSError (no such file) or ValueError (not a record)."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    try:
        return FrontRecord(int(doc["pid"]), str(doc["host"]), int(doc["port"]))
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{path} is not a vllm-sr pid file ({exc})") from None


def remove_pid_file(path: Path, pid: int) -> None:
    """Remove PATH if it still names PID (another front may have taken the port since)."""
    try:
        if read_pid_file(path).pid == pid:
            path.unlink()
    except (OSError, ValueError):
        pass


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ReloadError(Exception):
    """The reload could not be asked for or its outcome not read; one line saying why."""


def _reload_status(record: FrontRecord) -> dict[str, Any]:
    try:
        doc = httpx.get(f"{record.base_url}/api/v1/inventory", timeout=5).json()
    except (httpx.HTTPError, ValueError) as exc:
        raise ReloadError(f"the front at {record.base_url} does not answer: {exc}") from None
    if doc.get("pid") != record.pid:
        raise ReloadError(f"{record.base_url} answers as pid {doc.get('pid')}, not {record.pid} (a stale pid file)")
    status = doc.get("reload")
    if not isinstance(status, dict):
        raise ReloadError(f"{record.base_url} reports no reload status")
    return status


def reload_front(path: Path, timeout_s: float) -> dict[str, Any]:
    """Ask the front of pid file PATH to reload; its outcome (`reload` of its inventory)."""
    try:
        record = read_pid_file(path)
    except (OSError, ValueError) as exc:
        raise ReloadError(f"no running vllm-sr found through {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if not alive(record.pid):
        raise ReloadError(f"{path} names pid {record.pid}, which is not running (a stale pid file)")
    before = _reload_status(record)["generation"]
    os.kill(record.pid, signal.SIGHUP)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(POLL_S)
        status = _reload_status(record)
        if status["generation"] > before and status["state"] != "running":
            return status
    raise ReloadError(f"no outcome within {timeout_s:g} s; the front's inventory shows the reload's progress")
