"""A small, cheap load generator for the benchmarks: keep-alive HTTP/1.1 over asyncio streams.

httpx costs about a millisecond of CPU per request; on a 2-core machine that would be taken
from the server under test. This client costs a few tens of microseconds.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass
class LoadResult:
    requests: int
    seconds: float
    latencies: list[float]
    errors: int

    @property
    def rps(self) -> float:
        return self.requests / self.seconds

    def pct(self, q: float) -> float:
        xs = sorted(self.latencies)
        return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000 if xs else float("nan")


class Connection:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
            self.writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        head = (
            f"POST {path} HTTP/1.1\r\nhost: {self.host}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        ).encode()
        self.writer.write(head + body)
        assert self.reader is not None
        status_line = await self.reader.readline()
        status = int(status_line.split()[1])
        length = 0
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
        payload = await self.reader.readexactly(length)
        return status, payload

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def _run_load(host: str, port: int, bodies: Sequence[bytes], clients: int) -> LoadResult:
    queue: asyncio.Queue[bytes] = asyncio.Queue()
    for b in bodies:
        queue.put_nowait(b)
    latencies: list[float] = []
    errors = 0

    async def client() -> None:
        nonlocal errors
        conn = Connection(host, port)
        try:
            while True:
                try:
                    body = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                t0 = time.perf_counter()
                status, _ = await conn.post("/v1/embeddings", body)
                latencies.append(time.perf_counter() - t0)
                if status != 200:
                    errors += 1
        finally:
            conn.close()

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return LoadResult(len(bodies), time.perf_counter() - start, latencies, errors)


def run_load(base: str, bodies: Sequence[bytes], clients: int) -> LoadResult:
    host, port = base.removeprefix("http://").split(":")
    return asyncio.run(_run_load(host, int(port), bodies, clients))


def embeddings_body(text: str) -> bytes:
    return json.dumps({"input": text}).encode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def process(module: str, *args: str, timeout: float = 180) -> Iterator[tuple[str, int]]:
    """Start `python -m MODULE serve ARGS --port P`, wait for /health 200: (base URL, pid)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", module, "serve", *args, "--port", str(port), "--log-level", "warning"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{module} exited with {proc.returncode}")
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{module} did not become ready")
            time.sleep(0.2)
        yield base, proc.pid
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # a front stops its own workers
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


@contextmanager
def server(*args: str, timeout: float = 180) -> Iterator[str]:
    """A `vllm-srun serve ARGS` worker on a free port."""
    with process("vllm_srun.app.cli", *args, timeout=timeout) as (base, _pid):
        yield base
