"""What the front (`vllm-sr serve`, one replica) adds over talking to a worker directly.

The same embeddings load (`wrk`, a client that takes almost no CPU from the servers) runs against
a `vllm-srun serve` worker on TCP and against `vllm-sr serve` with one replica (its own worker on
a Unix socket), both with result caches off and the worker on the same thread count, alternating
A/B rounds so drift hits both.
Prints, measured side by side in this run:
  - throughput ratio front / direct at N concurrent clients (target ≥ 0.95),
  - the lone request's p50 direct and through the front, and the difference (target ≤ 1 ms),
  - p50 under load, both ways, and the CPU time per request of the worker and of the front
    process (the figure least disturbed by other load on a shared machine).

    python bench/front_overhead.py [--model all-MiniLM-L6-v2] [--connections 32] [--rounds 8] [--seconds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _load import LoadResult, cpu_seconds, embeddings_body, machine_load, merged, process, warm_up, wrk_load
from _texts import make_texts


def bodies(n: int, seed: int) -> list[bytes]:
    return [embeddings_body(t) for t in make_texts("short", n, seed)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="all-MiniLM-L6-v2", help="artifact (a fixture folder works too)")
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=5.0, help="seconds of load per round and side")
    ap.add_argument("--rounds", type=int, default=8, help="A/B rounds (short rounds, so other load hits both)")
    ap.add_argument("--lone-seconds", type=float, default=3.0, help="seconds of one connection per round")
    args = ap.parse_args()

    from vllm_srun.adapters.workers.cpu_budget import managed_worker_threads

    threads = managed_worker_threads()
    common = ["--result-cache-entries", "0"]
    print(
        f"# front overhead (wrk): {args.model}, {args.connections} connections, {args.rounds} rounds × "
        f"{args.seconds:g} s; worker threads {threads} both ways; result caches off; {machine_load()}"
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
        for base in bases.values():
            warm_up(base, bodies(128, 99))
        for round_ in range(args.rounds):
            for name in ("direct", "front") if round_ % 2 == 0 else ("front", "direct"):
                before = cpu_seconds(pids[name])
                got = wrk_load(bases[name], bodies(384, round_), connections=args.connections, seconds=args.seconds)
                loaded[name].append(got)
                cpu[name] += cpu_seconds(pids[name]) - before
                lone[name].append(
                    wrk_load(bases[name], bodies(1, 7 + round_), connections=1, seconds=args.lone_seconds)
                )
    d, f = merged(loaded["direct"]), merged(loaded["front"])
    for name, r in (("direct", d), ("front", f)):
        print(r.line(name, 7))
    lone_d = statistics.median(r.p50_ms for r in lone["direct"])
    lone_f = statistics.median(r.p50_ms for r in lone["front"])
    print(f"lone request p50 (median of rounds): direct {lone_d:.3f} ms, front {lone_f:.3f} ms")
    pairs = sorted(fr.rps / dr.rps for fr, dr in zip(loaded["front"], loaded["direct"]))
    print(
        f"throughput ratio front / direct ({args.connections} connections): {f.rps / d.rps:.3f} overall, "
        f"{statistics.median(pairs):.3f} median of {len(pairs)} A/B rounds (min {pairs[0]:.3f}, "
        f"max {pairs[-1]:.3f})  (target >= 0.95)"
    )
    print(f"added p50, lone request: {lone_f - lone_d:.3f} ms  (target <= 1 ms)")
    print(f"added p50 under load: {f.p50_ms - d.p50_ms:.3f} ms")
    worker_us, front_us = cpu["direct"] / d.requests * 1e6, cpu["front"] / f.requests * 1e6
    print(
        f"CPU per request under load: worker {worker_us:.0f} us, front process {front_us:.0f} us "
        f"({front_us / worker_us:.2f} of the worker's)"
    )
    print(f"# after: {machine_load()}")


if __name__ == "__main__":
    main()
