"""What the hostile tests need: the worker and front processes they attack (with short
connection limits), raw-socket clients, and a process's memory and descriptors from /proc."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests import prometheus_text
from tests.e2e.server import free_port
from tests.logs import log_path as log_path_of
from tests.stores import subprocess_env

# short limits, so each attack is over in seconds (the defaults are in docs/hardening.md)
LIMITS = (
    "--header-timeout", "1", "--keep-alive-timeout", "2", "--body-timeout", "2",
    "--max-header-bytes", "8192", "--max-connections", "48",
)  # fmt: skip
MAX_CONNECTIONS = 48
# Admission (R-ADM-1) counts a request's body bytes against --max-queued-tokens (default 65,536):
# with the default, normal clients get a prompt 429 with Retry-After while one of the attacks'
# multi-MB requests is pending. These servers admit them side by side instead, so the tests see
# what the event loop does while large requests are prepared (admission has its own hostile
# test, test_admission_burst.py).
QUEUED_TOKENS = 256 * 1024 * 1024
ADMISSION = ("--max-queued-tokens", str(QUEUED_TOKENS))


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    base: str
    log_path: Path
    host: str = "127.0.0.1"
    port: int = 0
    extra: dict[str, object] = field(default_factory=dict)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextmanager
def start(argv: list[str], ready: str = "/health", timeout: float = 180.0) -> Iterator[Server]:
    """Run `python -m ARGV… --port P` until /health answers 200; SIGTERM at the end."""
    port = free_port()
    log_path = log_path_of(f"vllm-hostile-{port}.log")
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", *argv, "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=subprocess_env(),
            start_new_session=True,
        )
    server = Server(proc, f"http://127.0.0.1:{port}", log_path, port=port)
    try:
        deadline = time.monotonic() + timeout
        while True:
            assert proc.poll() is None, f"exited {proc.returncode}:\n{server.log()[-3000:]}"
            try:
                if httpx.get(server.base + ready, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"not ready in {timeout} s:\n{server.log()[-3000:]}"
            time.sleep(0.2)
        yield server
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def connect(server: Server) -> socket.socket:
    s = socket.create_connection((server.host, server.port))
    s.settimeout(10)
    return s


def read_until_closed(s: socket.socket, limit: float = 10.0) -> bytes:
    out = b""
    s.settimeout(limit)
    try:
        while chunk := s.recv(65536):
            out += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    return out


def post(server: Server, path: str, body: object, timeout: float = 60, **headers: str) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(
        server.base + path,
        content=content,
        headers={"content-type": "application/json", **headers},
        timeout=timeout,
    )


def metric(server: Server, name: str, **labels: str) -> float:
    total = 0.0
    for line in httpx.get(server.base + "/metrics", timeout=10).text.splitlines():
        if line.startswith((name + "{", name + " ")) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


class LivenessProbe:
    """GET /health/live every 50 ms on its own connection while the attack runs: latencies."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.server.base, timeout=10) as client:
            while not self._stop.is_set():
                start = time.perf_counter()
                try:
                    status = client.get("/health/live").status_code
                    if status != 200:
                        self.failures.append(str(status))
                except httpx.HTTPError as exc:
                    self.failures.append(type(exc).__name__)
                self.latencies.append(time.perf_counter() - start)
                self._stop.wait(0.05)

    def __enter__(self) -> LivenessProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(15)

    def worst(self) -> float:
        return max(self.latencies)


def model_name(server: Server, kind: str) -> str:
    """The name a request uses for the tiny `embed` or `decide` model on this server."""
    if server.extra.get("kind") == "front":
        return kind
    return {"embed": "tiny-embed", "decide": "tiny-decision-llama"}[kind]


def connections(server: Server, name: str, **labels: str) -> float | None:
    """A connection metric of SERVER (`open_connections`, `connections_closed_total`: the worker's
    `vllm_srun_…`, the front's `vllm_sr_…`); None when the scrape itself was refused (a full table).
    The scrape's own connection counts among the open ones."""
    prefix = "vllm_sr" if server.extra.get("kind") == "front" else "vllm_srun"
    answer = httpx.get(server.base + "/metrics", timeout=10)
    if answer.status_code != 200:
        return None
    return prometheus_text.metric(answer.text, f"{prefix}_{name}", **labels)


def unread_bytes(server: Server, sockets: list[socket.socket]) -> list[int]:
    """Per client socket, the bytes it sent that SERVER has not read yet: the receive queue of the
    server's end of the connection (/proc/net/tcp; -1 while the kernel shows no such connection)."""
    queued: dict[int, int] = {}
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        _, local, remote, state, queues, *_ = line.split()
        if state == "01" and int(local.split(":")[1], 16) == server.port:  # ESTABLISHED, the server's end
            queued[int(remote.split(":")[1], 16)] = int(queues.split(":")[1], 16)
    return [queued.get(s.getsockname()[1], -1) for s in sockets]


def inventory(server: Server) -> dict[str, Any]:
    return httpx.get(server.base + "/api/v1/inventory", timeout=10).json()
