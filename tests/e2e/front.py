"""Start `vllm-sr serve` as a real process on a free loopback port and wait until it is ready."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.e2e.server import free_port
from tests.logs import log_path as log_path_of
from tests.stores import subprocess_env


@dataclass
class FrontProcess:
    proc: subprocess.Popen[bytes]
    base: str
    log_path: Path

    def inventory(self) -> dict[str, Any]:
        return httpx.get(f"{self.base}/api/v1/inventory", timeout=5).json()

    def workers(self, deployment: int = 0) -> list[dict[str, Any]]:
        return self.inventory()["deployments"][deployment]["workers"]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for(self, check, timeout: float, what: str) -> Any:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while True:
            found = check()
            if found:
                return found
            if self.proc.poll() is not None:
                raise AssertionError(f"vllm-sr exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} not reached in {timeout}s:\n{self.log()[-3000:]}")
            time.sleep(0.1)


def _health_ok(base: str) -> bool:
    try:
        return httpx.get(f"{base}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def running_front(
    *args: str, env: dict[str, str] | None = None, ready_timeout: float = 120.0
) -> Iterator[FrontProcess]:
    port = free_port()
    log_path = log_path_of(f"vllm-sr-e2e-{port}.log")
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "vllm_srun.app.front_cli", "serve", *args, "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=subprocess_env(env),
            start_new_session=True,
        )
    front = FrontProcess(proc, f"http://127.0.0.1:{port}", log_path)
    try:
        front.wait_for(lambda: _health_ok(front.base), ready_timeout, "/health 200")
        front.wait_for(  # /health needs one ready replica per deployment; the tests want all
            lambda: all(w["state"] == "ready" for d in front.inventory()["deployments"] for w in d["workers"]),
            ready_timeout,
            "every worker ready",
        )
        yield front
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # the front drains and stops its workers
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()  # its workers get SIGTERM from the kernel (PR_SET_PDEATHSIG)
                proc.wait()


async def post_once(base: str, path: str, body: bytes, timeout: float = 30.0) -> tuple[int, dict[str, str], bytes]:
    """One POST on its own connection with a cheap asyncio client: (status, headers, body)."""
    import asyncio

    host, port = base.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(
            f"POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode()
            + body
        )
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
        lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        payload = await asyncio.wait_for(reader.readexactly(int(headers.get("content-length", "0"))), timeout)
        return int(lines[0].split()[1]), headers, payload
    finally:
        writer.close()
