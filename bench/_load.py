"""Shared helpers of the load benchmarks: `wrk` as the client, servers as real processes.

The client is `wrk` (Debian package `wrk`), a C load generator whose CPU use is a small fraction of
a Python client's, so on a small machine the client does not take the cores the server under test
needs. `wrk_load` writes a Lua script that cycles through a list of request bodies (each wrk
connection starts at its own offset) and prints wrk's summary as one JSON line, which is parsed
into a `LoadResult` (requests, seconds, p50/p99/mean latency, errors).

Load runs for a duration, not a request count (wrk's model); `warm_up` runs a short load first.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

# Each wrk thread runs this script in its own Lua state. Bodies are one JSON document per line.
LUA = r"""
local bodies = {}
for line in io.lines(os.getenv("SRUN_WRK_BODIES")) do bodies[#bodies + 1] = line end
local path = os.getenv("SRUN_WRK_PATH")
local method = os.getenv("SRUN_WRK_METHOD")
local headers = {["Content-Type"] = "application/json"}
local next_body = 0
local threads = {}
local pause_ms = tonumber(os.getenv("SRUN_WRK_DELAY_MS") or "0")

function setup(thread)
  thread:set("offset", #threads * 7919)
  threads[#threads + 1] = thread
end

function init(args)
  next_body = offset or 0
  for name, value in pairs(wrk.headers) do  -- `-H` headers (e.g. Authorization) on every request
    if name ~= "Host" then headers[name] = value end
  end
end

function delay()
  return pause_ms  -- SRUN_WRK_DELAY_MS between a connection's answer and its next request
end

function request()
  next_body = next_body + 1
  if method == "GET" then return wrk.format("GET", path) end
  return wrk.format("POST", path, headers, bodies[(next_body % #bodies) + 1])
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write("SRUN_WRK_JSON " .. string.format(
    '{"requests": %d, "duration_us": %d, "p50_us": %d, "p90_us": %d, "p99_us": %d, "mean_us": %f, '
    .. '"max_us": %d, "connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.mean, latency.max, e.connect, e.read, e.write, e.status, e.timeout))
end
"""


@dataclass
class LoadResult:
    requests: int
    seconds: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    errors: int

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0

    def line(self, name: str, width: int = 34) -> str:
        return (
            f"{name:{width}s} {self.rps:8.1f} req/s  p50 {self.p50_ms:8.2f} ms  p99 {self.p99_ms:8.2f} ms  "
            f"errors {self.errors}"
        )


def merged(results: Sequence[LoadResult]) -> LoadResult:
    """Several runs as one: requests and seconds add up, latencies are request-weighted means of
    the runs' percentiles (an approximation; each run's own figures are exact)."""
    total = sum(r.requests for r in results) or 1

    def weighted(attr: str) -> float:
        return sum(getattr(r, attr) * r.requests for r in results) / total

    return LoadResult(
        sum(r.requests for r in results),
        sum(r.seconds for r in results),
        weighted("p50_ms"),
        weighted("p90_ms"),
        weighted("p99_ms"),
        weighted("mean_ms"),
        sum(r.errors for r in results),
    )


def wrk_binary() -> str:
    found = shutil.which("wrk")
    if found is None:
        raise SystemExit("bench: `wrk` is not installed (Debian: apt-get install -y wrk)")
    return found


def wrk_load(
    base: str,
    bodies: Sequence[bytes],
    *,
    connections: int,
    seconds: float,
    path: str = "/v1/embeddings",
    method: str = "POST",
    threads: int = 1,
    timeout_s: float = 30.0,
    headers: dict[str, str] | None = None,
    delay_ms: int = 0,
) -> LoadResult:
    """CONNECTIONS closed-loop keep-alive connections POST the BODIES (cycled) to BASE+PATH for
    SECONDS; one wrk thread by default (a second client thread only takes a core from the server).
    HEADERS go on every request (wrk `-H`); DELAY_MS: each connection waits that long after an
    answer before its next request (a paced client instead of a closed loop)."""
    if not bodies:
        raise ValueError("no bodies")
    if any(b"\n" in b for b in bodies):
        raise ValueError("a body spans lines; send compact JSON")
    with tempfile.TemporaryDirectory(prefix="srun-wrk-") as tmp:
        script, data = Path(tmp) / "cycle.lua", Path(tmp) / "bodies.jsonl"
        script.write_text(LUA)
        data.write_bytes(b"\n".join(bodies) + b"\n")
        env = {**os.environ, "SRUN_WRK_BODIES": str(data), "SRUN_WRK_PATH": path, "SRUN_WRK_METHOD": method}
        env["SRUN_WRK_DELAY_MS"] = str(max(0, int(delay_ms)))
        cmd = [
            wrk_binary(),
            f"-t{max(1, min(threads, connections))}",
            f"-c{connections}",
            f"-d{max(1, round(seconds))}s",
            f"--timeout={max(1, round(timeout_s))}s",
            *(arg for name, value in (headers or {}).items() for arg in ("-H", f"{name}: {value}")),
            "-s",
            str(script),
            base,
        ]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    settle(base)
    for line in out.stdout.splitlines():
        if line.startswith("SRUN_WRK_JSON "):
            doc = json.loads(line.removeprefix("SRUN_WRK_JSON "))
            errors = sum(doc[k] for k in ("connect", "read", "write", "status", "timeout"))
            return LoadResult(
                doc["requests"],
                doc["duration_us"] / 1e6,
                doc["p50_us"] / 1000,
                doc["p90_us"] / 1000,
                doc["p99_us"] / 1000,
                doc["mean_us"] / 1000,
                errors,
            )
    raise RuntimeError(f"wrk printed no summary (exit {out.returncode}): {out.stderr.strip()[:300]}")


def settle(base: str, timeout_s: float = 30.0) -> None:
    """Wait until the requests wrk abandoned when it stopped are gone from the server: they still
    count against a worker's admission (`--max-queue`) until their forward ends, and the next load
    would see 429s that only this script caused. Ours says so on /metrics
    (`vllm_srun_unanswered_requests`); a server that does not gets one second."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(base + "/metrics", timeout=5) as r:
                text = r.read().decode()
        except (OSError, ValueError):
            break
        counts = [
            float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith("vllm_srun_unanswered_requests")
        ]
        if not counts:
            break
        if sum(counts) == 0:
            return
        time.sleep(0.1)
    time.sleep(1.0)


def warm_up(base: str, bodies: Sequence[bytes], seconds: float = 2.0, path: str = "/v1/embeddings") -> None:
    wrk_load(base, bodies, connections=8, seconds=seconds, path=path)


def embeddings_body(text: str) -> bytes:
    return json.dumps({"input": text}, separators=(",", ":")).encode()


def machine_load() -> str:
    """`uptime`'s load averages and the CPU count, to print next to the figures."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} CPUs"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(base: str, proc: subprocess.Popen, what: str, timeout: float, path: str = "/health") -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{base}{path}", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not become ready in {timeout:.0f} s")
        time.sleep(0.2)


@contextmanager
def command(
    argv: Sequence[str], port: int, what: str, *, timeout: float = 300, health: str = "/health", env=None
) -> Iterator[tuple[str, int]]:
    """Run ARGV (a server listening on PORT) until it answers 200 on HEALTH: (base URL, pid)."""
    with tempfile.TemporaryDirectory(prefix="srun-bench-") as tmp, (Path(tmp) / "server.log").open("wb") as log:
        proc = subprocess.Popen(list(argv), stdout=log, stderr=log, start_new_session=True, env=env)
        base = f"http://127.0.0.1:{port}"
        try:
            try:
                wait_ready(base, proc, what, timeout, health)
            except RuntimeError:
                log.flush()
                tail = (Path(tmp) / "server.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{what} did not start; its log ends:\n{tail}") from None
            yield base, proc.pid
        finally:
            os.killpg(proc.pid, signal.SIGTERM)  # a front stops its own workers
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


@contextmanager
def process(
    module: str, *args: str, timeout: float = 300, env: dict[str, str] | None = None
) -> Iterator[tuple[str, int]]:
    """Start `python -m MODULE serve ARGS --port P` (with ENV added to ours), wait for /health 200:
    (base URL, pid)."""
    port = free_port()
    argv = [sys.executable, "-m", module, "serve", *args, "--port", str(port), "--log-level", "warning"]
    with command(argv, port, module, timeout=timeout, env={**os.environ, **env} if env else None) as found:
        yield found


@contextmanager
def server(*args: str, timeout: float = 300) -> Iterator[str]:
    """A `vllm-srun serve ARGS` worker on a free port."""
    with process("vllm_srun.app.cli", *args, timeout=timeout) as (base, _pid):
        yield base


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
