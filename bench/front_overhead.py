"""What the front (`vllm-sr serve`, one replica) adds over talking to a worker directly.

The same embeddings load runs against a `vllm-srun serve` worker on TCP and against
`vllm-sr serve` with one replica (its own worker on a Unix socket), both with result caches
off and the worker on the same thread count, alternating A/B rounds so drift hits both.
Prints, measured side by side in this run:
  - throughput ratio front / direct at N concurrent clients (target ≥ 0.95),
  - the lone request's p50 direct and through the front, and the difference (target ≤ 1 ms),
  - p50 under load, both ways, and the CPU time per request of the worker and of the front
    process (the figure least disturbed by other load on a shared machine).

    python bench/front_overhead.py [--model all-MiniLM-L6-v2] [--clients 32] [--rounds 8]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _load import LoadResult, embeddings_body, process, run_load

WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "for",
    "on",
    "that",
    "with",
    "as",
    "by",
    "at",
    "from",
    "model",
    "request",
    "route",
    "billing",
    "account",
    "refund",
    "invoice",
    "password",
    "reset",
    "shipping",
    "order",
    "delivery",
    "late",
    "question",
    "answer",
    "price",
    "plan",
    "upgrade",
]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def texts(n: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [embeddings_body(" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 20)))) for _ in range(n)]


def merged(results: list[LoadResult]) -> LoadResult:
    return LoadResult(
        sum(r.requests for r in results),
        sum(r.seconds for r in results),
        [x for r in results for x in r.latencies],
        sum(r.errors for r in results),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="all-MiniLM-L6-v2", help="artifact (a fixture folder works too)")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--requests", type=int, default=384, help="requests per round under load")
    ap.add_argument("--rounds", type=int, default=8, help="A/B rounds (short rounds, so other load hits both)")
    ap.add_argument("--lone", type=int, default=100, help="sequential requests per round (lone latency)")
    args = ap.parse_args()

    from vllm_srun.adapters.workers.cpu_budget import managed_worker_threads

    threads = managed_worker_threads()
    common = ["--result-cache-entries", "0"]
    print(
        f"# front overhead: {args.model}, {args.clients} clients, {args.rounds} rounds × {args.requests} "
        f"requests; worker threads {threads} both ways; result caches off; {os.cpu_count()} CPUs"
    )
    loaded: dict[str, list[LoadResult]] = {"direct": [], "front": []}
    lone: dict[str, list[LoadResult]] = {"direct": [], "front": []}
    cpu: dict[str, float] = {"direct": 0.0, "front": 0.0}
    with (
        process("vllm_srun.app.cli", args.model, *common, "--threads", str(threads)) as (direct_base, direct_pid),
        process("vllm_srun.app.front_cli", args.model, "--platform", "cpu", *common) as (front_base, front_pid),
    ):
        bases = {"direct": direct_base, "front": front_base}
        pids = {"direct": direct_pid, "front": front_pid}
        for base in bases.values():  # warm-up
            run_load(base, texts(128, 99), 8)
        for round_ in range(args.rounds):
            for name in ("direct", "front") if round_ % 2 == 0 else ("front", "direct"):
                before = cpu_seconds(pids[name])
                loaded[name].append(run_load(bases[name], texts(args.requests, round_), args.clients))
                cpu[name] += cpu_seconds(pids[name]) - before
                one = texts(1, 7 + round_) * args.lone
                lone[name].append(run_load(bases[name], one, 1))
    d, f = merged(loaded["direct"]), merged(loaded["front"])
    ld, lf = merged(lone["direct"]), merged(lone["front"])
    for name, r in (("direct", d), ("front", f)):
        print(f"{name:7s} {r.rps:8.1f} req/s  p50 {r.pct(0.5):6.2f} ms  p99 {r.pct(0.99):6.2f} ms  errors {r.errors}")
    print(f"lone request p50: direct {ld.pct(0.5):.3f} ms, front {lf.pct(0.5):.3f} ms")
    pairs = sorted(fr.rps / dr.rps for fr, dr in zip(loaded["front"], loaded["direct"]))
    print(
        f"throughput ratio front / direct ({args.clients} clients): {f.rps / d.rps:.3f} overall, "
        f"{statistics.median(pairs):.3f} median of {len(pairs)} A/B rounds (min {pairs[0]:.3f}, "
        f"max {pairs[-1]:.3f})  (target >= 0.95)"
    )
    print(f"added p50, lone request: {lf.pct(0.5) - ld.pct(0.5):.3f} ms  (target <= 1 ms)")
    print(f"added p50 under load: {f.pct(0.5) - d.pct(0.5):.3f} ms")
    worker_us, front_us = cpu["direct"] / d.requests * 1e6, cpu["front"] / f.requests * 1e6
    print(
        f"CPU per request under load: worker {worker_us:.0f} us, front process {front_us:.0f} us "
        f"({front_us / worker_us:.2f} of the worker's)"
    )


if __name__ == "__main__":
    main()
