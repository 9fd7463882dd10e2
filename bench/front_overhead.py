"""What the front (`vllm-sr serve`, one replica) adds over talking to a worker directly.

The same embeddings load runs against a `vllm-srun serve` worker on TCP and against
`vllm-sr serve` with one replica (its own worker on a Unix socket), both with result caches
off and the worker on the same thread count, alternating A/B rounds so drift hits both.
Prints, measured side by side in this run:
  - throughput ratio front / direct at N concurrent clients (target ≥ 0.95),
  - the lone request's p50 direct and through the front, and the difference (target ≤ 1 ms),
  - p50 under load, both ways.

    python bench/front_overhead.py [--model all-MiniLM-L6-v2] [--clients 32] [--requests 1024]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _load import LoadResult, embeddings_body, free_port, run_load, server  # noqa: E402

WORDS = (
    "the of and to in is was for on that with as by at from model request route billing account "
    "refund invoice password reset shipping order delivery late question answer price plan upgrade"
).split()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


FRONT_PID: list[int] = []


@contextmanager
def front(*args: str, timeout: float = 180) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm_srun.app.front_cli", "serve", *args, "--port", str(port), "--log-level", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    FRONT_PID[:] = [proc.pid]
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vllm-sr exited with {proc.returncode}")
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("vllm-sr did not become ready")
            time.sleep(0.2)
        yield base
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def texts(n: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [embeddings_body(" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 20)))) for _ in range(n)]


def merged(results: list[LoadResult]) -> LoadResult:
    return LoadResult(
        sum(r.requests for r in results), sum(r.seconds for r in results),
        [x for r in results for x in r.latencies], sum(r.errors for r in results),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="all-MiniLM-L6-v2", help="artifact (a fixture folder works too)")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--requests", type=int, default=1024, help="requests per round under load")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lone", type=int, default=300, help="sequential requests per round (lone latency)")
    args = ap.parse_args()

    from vllm_srun.adapters.workers.cpu_budget import managed_worker_threads

    threads = managed_worker_threads()
    common = ["--result-cache-entries", "0"]
    print(f"# front overhead: {args.model}, {args.clients} clients, {args.rounds} rounds × {args.requests} "
          f"requests; worker threads {threads} both ways; result caches off; {os.cpu_count()} CPUs")
    loaded: dict[str, list[LoadResult]] = {"direct": [], "front": []}
    lone: dict[str, list[LoadResult]] = {"direct": [], "front": []}
    front_cpu: list[float] = []
    with server(args.model, *common, "--threads", str(threads)) as direct_base, \
            front(args.model, "--platform", "cpu", *common) as front_base:
        bases = {"direct": direct_base, "front": front_base}
        for name, base in bases.items():  # warm-up
            run_load(base, texts(128, 99), 8)
        for round_ in range(args.rounds):
            for name in (("direct", "front") if round_ % 2 == 0 else ("front", "direct")):
                cpu0 = cpu_seconds(FRONT_PID[0])
                loaded[name].append(run_load(bases[name], texts(args.requests, round_), args.clients))
                if name == "front":
                    front_cpu.append(cpu_seconds(FRONT_PID[0]) - cpu0)
                one = texts(1, 7 + round_) * args.lone
                lone[name].append(run_load(bases[name], one, 1))
    d, f = merged(loaded["direct"]), merged(loaded["front"])
    ld, lf = merged(lone["direct"]), merged(lone["front"])
    for name, r in (("direct", d), ("front", f)):
        print(f"{name:7s} {r.rps:8.1f} req/s  p50 {r.pct(0.5):6.2f} ms  p99 {r.pct(0.99):6.2f} ms  errors {r.errors}")
    print(f"lone request p50: direct {ld.pct(0.5):.3f} ms, front {lf.pct(0.5):.3f} ms")
    print(f"throughput ratio front / direct ({args.clients} clients): {f.rps / d.rps:.3f}  (target >= 0.95)")
    print(f"added p50, lone request: {lf.pct(0.5) - ld.pct(0.5):.3f} ms  (target <= 1 ms)")
    print(f"added p50 under load: {f.pct(0.5) - d.pct(0.5):.3f} ms")
    print(f"front process CPU per request under load: {sum(front_cpu) / f.requests * 1e6:.0f} us")


if __name__ == "__main__":
    main()
