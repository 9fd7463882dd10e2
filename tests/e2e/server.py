"""Start `vllm-srun serve` as a real process on a free loopback port and wait until ready."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from tests.logs import log_path as log_path_of
from tests.stores import subprocess_env

# the base URLs of the workers running now
WORKERS: set[str] = set()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_server(*args: str, ready_timeout: float = 180.0, env: dict | None = None) -> Iterator[str]:
    port = free_port()
    log_path = log_path_of(f"vllm-srun-e2e-{port}.log")
    log = log_path.open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm_srun.app.cli", "serve", *args, "--port", str(port), "--log-level", "warning"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=subprocess_env(env),
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    WORKERS.add(base)  # its answers are checked against the OpenAPI document (tests/e2e/conftest.py)
    try:
        deadline = time.monotonic() + ready_timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"server not ready in {ready_timeout}s:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.2)
        yield base
    finally:
        WORKERS.discard(base)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()
