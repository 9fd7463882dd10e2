"""Soak: normal clients alongside a hostile mix, against a real worker (or front), in one run.

Phases: QUIET (normal clients alone: the baseline), HOSTILE (normal clients plus the hostile
mix for --minutes), AFTER (no load: does memory come back, do descriptors go?). Normal clients
are `wrk` (one thread, --connections keep-alive connections, small varied embeddings requests
from a Lua script that counts statuses); the hostile mix runs on asyncio in this process:

- slow headers: connections that send one header byte a second (slowloris);
- idle sockets: connections that never send anything, kept up to the server's connection cap;
- maximal bodies: bodies just under --max-request-bytes (2,048 over-long inputs), and bodies that
  claim more than the limit;
- deep JSON: a `state` nested 200,000 levels; lying Content-Lengths (a body that never ends);
- compressed bombs: gzip and zstd bodies that inflate to 60 MB.

Prints requests by status (normal and hostile), normal clients' p50/p99 quiet and under attack,
`/health/live` p50/p99 (a probe every 100 ms on its own connection), RSS and open descriptors
over time, and each target's verdict: 0 failed normal requests, normal p99 <= 3x quiet,
/health/live p99 <= 50 ms, RSS within 10% and descriptors within 16 of their quiet values after.

    python bench/soak.py [--minutes 1] [--target worker|front] [--model all-MiniLM-L6-v2]

Needs `wrk` (Debian: `apt-get install -y wrk`).
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import random
import re
import resource
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _load import process

WRK_SCRIPT = r"""
local threads = {}
setup = function(thread) table.insert(threads, thread) end
local n = 0
statuses = {}
local words = {"refund", "invoice", "account", "billing", "the", "model", "request", "route", "late", "order"}
request = function()
  n = n + 1
  local text = "normal " .. n
  for i = 1, math.random(3, 24) do text = text .. " " .. words[math.random(#words)] end
  return wrk.format("POST", "/v1/embeddings", {["Content-Type"] = "application/json"},
                    '{"model": "MODEL", "input": "' .. text .. '"}')
end
response = function(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
end
done = function(summary, latency, requests)
  local parts = {}
  for _, thread in ipairs(threads) do
    for status, count in pairs(thread:get("statuses")) do parts[#parts + 1] = status .. "=" .. count end
  end
  io.write("STATUSES " .. table.concat(parts, ",") .. "\n")
end
"""


@dataclass
class Normal:
    requests: int = 0
    failed: int = 0
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")
    statuses: Counter[str] = field(default_factory=Counter)


def _ms(text: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text).groups()  # type: ignore[union-attr]
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


async def run_wrk(url: str, seconds: float, connections: int, script: str) -> Normal:
    argv = ["wrk", "-t1", f"-c{connections}", f"-d{int(seconds)}s", "--timeout", "30s", "--latency", "-s", script, url]
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE)
    out = (await proc.communicate())[0].decode()
    result = Normal(requests=int(re.search(r"(\d+) requests in", out).group(1)))  # type: ignore[union-attr]
    latency = dict(re.findall(r"^\s+(50|99)%\s+(\S+)$", out, re.M))
    result.p50_ms, result.p99_ms = _ms(latency["50"]), _ms(latency["99"])
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    result.failed = (int(non2xx.group(1)) if non2xx else 0) + (sum(map(int, errors.groups())) if errors else 0)
    line = re.search(r"^STATUSES (.*)$", out, re.M)
    for part in line.group(1).split(",") if line and line.group(1) else []:
        status, count = part.split("=")
        result.statuses[status] += int(count)
    if errors:
        result.statuses["socket_error"] += sum(map(int, errors.groups()))
    return result


# ---- the hostile mix ----------------------------------------------------------------------------------
class Hostile:
    def __init__(self, host: str, port: int, model: str, max_bytes: int, idle: int) -> None:
        self.host, self.port, self.model, self.max_bytes, self.idle = host, port, model, max_bytes, idle
        self.statuses: Counter[tuple[str, str]] = Counter()
        self.stop = asyncio.Event()
        per_input = (max_bytes - 4096) // 2048 - 16  # 2,048 inputs that fill the body, each over the model's limit
        rng = random.Random(9)
        words = ["".join(rng.choice("abcdefghij") for _ in range(rng.randint(1, 6))) for _ in range(4096)]
        text = " ".join(words)
        inputs = [text[i % 97 : i % 97 + per_input] for i in range(2048)]
        self.maximal = json.dumps({"model": model, "input": inputs}).encode()
        deep = b"[" * 200_000 + b"]" * 200_000
        self.deep = b'{"model": "%s", "state": %s, "questions": {"q": {"type": "noul"}}}' % (model.encode(), deep)
        self.gzip_bomb = gzip.compress(b" " * 60_000_000)
        try:
            from backports.zstd import compress as zstd_compress
        except ImportError:  # pragma: no cover - python 3.14
            from compression.zstd import compress as zstd_compress
        self.zstd_bomb = zstd_compress(b" " * 60_000_000)

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection(self.host, self.port)

    async def _request(self, kind: str, path: str, body: bytes, headers: str = "", length: int | None = None) -> None:
        try:
            reader, writer = await self._open()
        except OSError:
            self.statuses[(kind, "connect_error")] += 1
            return
        try:
            head = (
                f"POST {path} HTTP/1.1\r\nhost: soak\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body) if length is None else length}\r\n{headers}connection: close\r\n\r\n"
            )
            writer.write(head.encode() + body)
            await writer.drain()
            status_line = await asyncio.wait_for(reader.readline(), 120)
            status = status_line.split()[1].decode() if status_line else "closed"
        except (TimeoutError, OSError, IndexError):
            status = "closed"
        finally:
            writer.close()
        self.statuses[(kind, status)] += 1

    async def _loop(self, kind: str, pause: float, *request: object) -> None:
        while not self.stop.is_set():
            await self._request(kind, *request)  # type: ignore[arg-type]
            await asyncio.sleep(pause)

    async def slow_headers(self, connections: int) -> None:
        async def one() -> None:
            while not self.stop.is_set():
                try:
                    reader, writer = await self._open()
                except OSError:
                    await asyncio.sleep(1)
                    continue
                head = b"POST /v1/embeddings HTTP/1.1\r\nhost: soak\r\nx-slow: " + b"a" * 10_000
                status = "closed"
                try:
                    for byte in head:
                        if self.stop.is_set():
                            break
                        writer.write(bytes([byte]))
                        try:
                            line = await asyncio.wait_for(reader.readline(), 1.0)  # one byte a second
                        except TimeoutError:
                            continue
                        status = line.split()[1].decode() if line else "closed"
                        break
                except (OSError, IndexError):
                    pass
                finally:
                    writer.close()
                self.statuses[("slow_headers", status)] += 1
                await asyncio.sleep(1.0)

        await asyncio.gather(*(one() for _ in range(connections)))

    async def idle_sockets(self) -> None:
        async def one() -> None:
            while not self.stop.is_set():
                try:
                    reader, writer = await self._open()
                except OSError:
                    await asyncio.sleep(0.5)
                    continue
                stop = asyncio.ensure_future(self.stop.wait())
                closed = asyncio.ensure_future(reader.read())
                await asyncio.wait({stop, closed}, return_when=asyncio.FIRST_COMPLETED)
                stop.cancel()
                writer.close()
                if closed.done():
                    self.statuses[("idle_socket", "closed_by_server")] += 1
                    await asyncio.sleep(1.0)  # then take its place again
                closed.cancel()

        await asyncio.gather(*(one() for _ in range(self.idle)))

    async def run(self, slow: int) -> None:
        tasks = [
            self.slow_headers(slow),
            self.idle_sockets(),
            self._loop("maximal_body", 0.05, "/v1/embeddings", self.maximal),
            self._loop("over_limit", 0.5, "/v1/embeddings", b"{}", "", self.max_bytes * 4),
            self._loop("deep_json", 0.2, "/v1/decisions", self.deep),
            self._loop("gzip_bomb", 0.2, "/v1/embeddings", self.gzip_bomb, "content-encoding: gzip\r\n"),
            self._loop("zstd_bomb", 0.2, "/v1/embeddings", self.zstd_bomb, "content-encoding: zstd\r\n"),
            self._loop("short_body", 0.5, "/v1/embeddings", b'{"input": ', "", 1000),
        ]
        await asyncio.gather(*tasks)


# ---- probes --------------------------------------------------------------------------------------------
async def live_probe(host: str, port: int, stop: asyncio.Event, latencies: list[float], failures: Counter[str]) -> None:
    reader = writer = None
    while not stop.is_set():
        start = time.perf_counter()
        try:
            if writer is None:
                reader, writer = await asyncio.open_connection(host, port)
            writer.write(b"GET /health/live HTTP/1.1\r\nhost: probe\r\n\r\n")
            assert reader is not None
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            length = int(re.search(rb"content-length: (\d+)", head, re.I).group(1))  # type: ignore[union-attr]
            await reader.readexactly(length)
            latencies.append(time.perf_counter() - start)
        except (TimeoutError, OSError, asyncio.IncompleteReadError, AttributeError) as exc:
            failures[type(exc).__name__] += 1
            if writer is not None:
                writer.close()
            reader = writer = None
        await asyncio.sleep(0.1)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def sample(
    pids: dict[str, int], stop: asyncio.Event, rows: list[tuple[float, str, float, int]], t0: float
) -> None:
    while not stop.is_set():
        for name, pid in pids.items():
            rows.append((time.monotonic() - t0, name, rss_mib(pid), fds(pid)))
        await asyncio.sleep(1.0)


def pct(values: list[float], q: float) -> float:
    xs = sorted(values)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000 if xs else float("nan")


# ---- the run ------------------------------------------------------------------------------------------------
async def soak(base: str, pids: dict[str, int], model: str, args: argparse.Namespace, script: str) -> bool:
    host, port_text = base.removeprefix("http://").split(":")
    port = int(port_text)
    url = f"{base}/v1/embeddings"
    t0 = time.monotonic()
    rows: list[tuple[float, str, float, int]] = []
    sampling = asyncio.Event()
    sampler = asyncio.ensure_future(sample(pids, sampling, rows, t0))
    phases: dict[str, tuple[Normal, list[float], Counter[str]]] = {}
    marks: dict[str, float] = {}
    hostile = Hostile(host, port, model, args.max_request_bytes, args.idle_sockets)
    for phase, seconds in (("quiet", args.quiet_seconds), ("hostile", args.minutes * 60)):
        marks[phase] = time.monotonic() - t0
        stop = asyncio.Event()
        latencies: list[float] = []
        failures: Counter[str] = Counter()
        probe = asyncio.ensure_future(live_probe(host, port, stop, latencies, failures))
        attack = asyncio.ensure_future(hostile.run(args.slow_headers)) if phase == "hostile" else None
        normal = await run_wrk(url, seconds, args.connections, script)
        stop.set()
        if attack is not None:
            hostile.stop.set()
        await probe
        if attack is not None:
            await asyncio.wait_for(attack, 180)
        phases[phase] = (normal, latencies, failures)
    marks["after"] = time.monotonic() - t0
    await asyncio.sleep(args.after_seconds)
    sampling.set()
    await sampler

    print(
        f"\nload average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())} (1, 5, 15 min); {os.cpu_count()} CPUs"
    )
    print(f"\nnormal clients (wrk -t1 -c{args.connections}, small embeddings requests)")
    print(f"  {'phase':8} {'requests':>9} {'failed':>7} {'p50 ms':>8} {'p99 ms':>8}  statuses")
    for phase, (normal, _, _) in phases.items():
        codes = ", ".join(f"{k}: {v}" for k, v in sorted(normal.statuses.items()))
        print(f"  {phase:8} {normal.requests:9d} {normal.failed:7d} {normal.p50_ms:8.2f} {normal.p99_ms:8.2f}  {codes}")
    print("\n/health/live (every 100 ms, own connection)")
    for phase, (_, latencies, failures) in phases.items():
        print(
            f"  {phase:8} n={len(latencies):5d}  p50 {pct(latencies, 0.5):7.2f} ms  p99 {pct(latencies, 0.99):7.2f} ms"
            f"  max {pct(latencies, 1.0):7.2f} ms  failures {dict(failures) or 0}"
        )
    print("\nhostile requests by status")
    for (kind, status), count in sorted(hostile.statuses.items()):
        print(f"  {kind:16} {status:18} {count:7d}")
    print("\nRSS (MiB) and open descriptors over time")
    for name in pids:
        series = [(t, r, f) for t, n, r, f in rows if n == name]
        step = max(1, len(series) // 16)
        print(f"  {name}: " + "  ".join(f"{t:5.0f}s {r:6.0f}/{f}" for t, r, f in series[::step]))
    quiet, hot = phases["quiet"][0], phases["hostile"][0]
    live_p99 = pct(phases["hostile"][1], 0.99)
    ok = True
    print("\nverdicts")
    checks = [
        (
            "failed normal requests (quiet + hostile) == 0",
            quiet.failed + hot.failed == 0,
            f"{quiet.failed + hot.failed}",
        ),
        (
            "normal p99 under attack <= 3x quiet",
            hot.p99_ms <= 3 * quiet.p99_ms,
            f"{hot.p99_ms:.2f} ms vs {quiet.p99_ms:.2f} ms ({hot.p99_ms / quiet.p99_ms:.2f}x)",
        ),
        ("/health/live p99 under attack <= 50 ms", live_p99 <= 50, f"{live_p99:.2f} ms"),
    ]
    for name in pids:
        before = [(r, f) for t, n, r, f in rows if n == name and t < marks["hostile"]][-1]
        peak = max(r for t, n, r, f in rows if n == name)
        after = [(r, f) for t, n, r, f in rows if n == name][-1]
        settled = [r for t, n, r, f in rows if n == name and t >= marks["after"] + 5]  # the trims ran
        checks.append(
            (
                f"{name}: RSS flat after the attack (last {args.after_seconds - 5:g} s within 2%)",
                bool(settled) and max(settled) <= min(settled) * 1.02,
                f"{min(settled, default=0):.0f}..{max(settled, default=0):.0f} MiB",
            )
        )
        checks.append(
            (
                f"{name}: RSS after within 10% of quiet",
                after[0] <= before[0] * 1.10,
                f"{before[0]:.0f} -> peak {peak:.0f} -> {after[0]:.0f} MiB",
            )
        )
        checks.append(
            (f"{name}: descriptors after within 16 of quiet", after[1] <= before[1] + 16, f"{before[1]} -> {after[1]}")
        )
    for name, passed, detail in checks:
        ok &= passed
        print(f"  [{'ok' if passed else 'FAIL'}] {name}: {detail}")
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=1.0, help="the hostile phase (default: %(default)s)")
    parser.add_argument("--quiet-seconds", type=float, default=20.0)
    parser.add_argument("--after-seconds", type=float, default=20.0)
    parser.add_argument("--target", choices=("worker", "front"), default="worker")
    parser.add_argument("--model", default="all-MiniLM-L6-v2")
    parser.add_argument("--connections", type=int, default=4, help="normal keep-alive connections (wrk)")
    parser.add_argument("--slow-headers", type=int, default=64)
    parser.add_argument("--max-connections", type=int, default=512, help="the server's cap; idle sockets fill it")
    parser.add_argument("--max-request-bytes", type=int, default=8 * 1024 * 1024)
    parser.add_argument(
        "--max-queued-tokens",
        type=int,
        default=256 * 1024 * 1024,
        help="each model's admission limit (R-ADM-1); the default here lets normal clients in beside the "
        "maximal bodies (at the worker's own default, 65,536, they get 429 with Retry-After while one is pending)",
    )
    args = parser.parse_args()
    args.idle_sockets = max(1, args.max_connections - args.slow_headers - 16)  # with the rest: up to the cap
    if shutil.which("wrk") is None:
        sys.exit("soak: needs wrk (apt-get install -y wrk)")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 4 * args.max_connections + 1024)), hard))
    flags = ["--max-connections", str(args.max_connections), "--max-request-bytes", str(args.max_request_bytes)]
    flags += ["--result-cache-entries", "0", "--max-queued-tokens", str(args.max_queued_tokens)]
    with tempfile.TemporaryDirectory(prefix="srun-soak-") as tmp:
        script = Path(tmp) / "normal.lua"
        if args.target == "worker":
            module, served = "vllm_srun.app.cli", Path(args.model).name
            argv = [args.model, *flags]
        else:
            module, served = "vllm_srun.app.front_cli", "primary"
            argv = [args.model, "--platform", "cpu", "-dp", "2", *flags]
        script.write_text(WRK_SCRIPT.replace("MODEL", served))
        with process(module, *argv) as (base, pid):
            time.sleep(2.0)
            pids = {args.target: pid}
            if args.target == "front":
                import urllib.request

                with urllib.request.urlopen(f"{base}/api/v1/inventory", timeout=5) as r:
                    workers = json.load(r)["deployments"][0]["workers"]
                pids.update({f"worker{i}": w["pid"] for i, w in enumerate(workers) if w.get("pid")})
            print(
                f"soak: {args.target} serving {args.model} at {base}; quiet {args.quiet_seconds:g} s, hostile "
                f"{args.minutes:g} min, after {args.after_seconds:g} s; cap {args.max_connections} connections"
            )
            ok = asyncio.run(soak(base, pids, served, args, str(script)))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
