"""Two tenants on one CPU worker (issue 23 item 5, R-FAIR): does a flood of tenant A leave tenant
B its latency, its answers and its share, and A its throughput?

One `vllm-srun serve MODEL --api-key-file KEYS` worker (tenants A and B, default policies), and
`wrk` as the client (C, one thread per process), all in one run:
  1. A alone: 256 closed-loop connections for `--seconds`: A's answered requests/s (the
     single-tenant figure, its 200s) and p99;
  2. B alone, quiet: `--b-connections` connections, each pausing between requests so that B asks
     about `--b-share` (10 %) of step 1's rate: B's p99 quiet;
  3. side by side: the same two loads at once, two wrk processes with their own
     `Authorization: Bearer` keys: B's p99 under A's flood, B's non-2xx answers (429s), A's
     answered requests/s.
It prints B's p99 under the flood ÷ quiet (target ≤ 2), B's refusals (target 0) and A's
answered rate ÷ the single-tenant figure (target ≥ 0.9). Beside the last, two figures that say
what it can be: A's ceiling, 1 − B's answered rate ÷ A's alone (what A keeps if B's requests
cost the server exactly what A's do: the target of 0.9 is that ceiling when B asks 10 %), and A's
and B's answered rates side by side ÷ A's alone (1 when B's requests cost what A's would have).
`--rounds N` runs the three steps N times on the same worker and prints, besides each round, the
medians of the ratios and how many rounds met each target: on a small shared host one round's
p99 ratio moves by tenths, its A ratio by a few hundredths.

    python bench/tenants.py [--model all-MiniLM-L6-v2] [--seconds 20] [--b-connections 8] [--b-share 0.1] [--rounds 1]
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _load import LoadResult, embeddings_body, machine_load, server, wrk_load
from _texts import make_texts

KEYS = {"A": "srk-bench-tenant-a-" + "a" * 32, "B": "srk-bench-tenant-b-" + "b" * 32}


def bodies(tenant: str, count: int = 512) -> list[bytes]:
    """Short texts of the load benchmarks (`_texts.py`), distinct per tenant and per body."""
    seed = 1 if tenant == "A" else 2
    return [embeddings_body(f"{tenant} {n} {text}") for n, text in enumerate(make_texts("short", count, seed))]


def answered(result: LoadResult) -> float:
    """Answered (2xx) requests per second: wrk counts the others among its errors."""
    return max(0, result.requests - result.errors) / result.seconds if result.seconds > 0 else 0.0


def side_by_side(base: str, a: dict, b: dict) -> tuple[LoadResult, LoadResult]:
    """Both loads at once, each its own wrk process."""
    results: dict[str, LoadResult] = {}

    def run(name: str, kwargs: dict) -> None:
        results[name] = wrk_load(base, **kwargs)

    threads = [threading.Thread(target=run, args=(name, kw)) for name, kw in (("A", a), ("B", b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results["A"], results["B"]


@dataclass
class Round:
    """One round's four loads and the targets' ratios."""

    alone: LoadResult
    quiet: LoadResult
    a_flood: LoadResult
    b_flooded: LoadResult
    delay_ms: int

    @property
    def p99_ratio(self) -> float:
        return self.b_flooded.p99_ms / self.quiet.p99_ms if self.quiet.p99_ms > 0 else float("inf")

    @property
    def a_ratio(self) -> float:
        single = answered(self.alone)
        return answered(self.a_flood) / single if single > 0 else 0.0

    @property
    def a_ceiling(self) -> float:
        """A's rate ÷ alone if B's requests cost the server exactly what A's do: 1 − B's answered
        rate ÷ A's alone rate. The target of 0.9 sits at this ceiling when B asks 10 %."""
        single = answered(self.alone)
        return 1 - answered(self.b_flooded) / single if single > 0 else 0.0

    @property
    def both_ratio(self) -> float:
        """A's and B's answered rates side by side ÷ A's alone: what the server answers with both
        tenants, against one (1: B's requests cost what A's would have; below: B's cost more)."""
        single = answered(self.alone)
        return (answered(self.a_flood) + answered(self.b_flooded)) / single if single > 0 else 0.0

    def report(self, b_connections: int) -> None:
        single = answered(self.alone)
        print(self.alone.line("A alone (256 conns)"))
        print(self.quiet.line(f"B alone ({b_connections} conns, {self.delay_ms} ms pause)"))
        print(self.a_flood.line("A beside B"))
        print(self.b_flooded.line("B beside A's flood"))
        print(f"B p99 under A's flood ÷ quiet: {self.p99_ratio:.2f} (target <= 2)")
        print(f"B non-2xx answers (429s) under the flood: {self.b_flooded.errors} (target 0)")
        print(
            f"A answered/s beside B ÷ alone: {answered(self.a_flood):.1f} / {single:.1f} = {self.a_ratio:.2f} "
            "(target >= 0.9)"
        )
        share = self.b_flooded.rps / single if single else 0
        print(f"B asked {self.b_flooded.rps:.1f} req/s = {share:.2f} of A's single-tenant rate")
        print(
            f"A's ceiling at B's share (B costing what A does): {self.a_ceiling:.2f}; "
            f"A and B answered side by side ÷ A alone: {self.both_ratio:.2f}"
        )


def one_round(base: str, ns: argparse.Namespace, auth: dict[str, dict[str, str]]) -> Round:
    """A alone, then B alone at its share of A's rate, then both at once."""
    a_bodies, b_bodies = bodies("A"), bodies("B")
    a_load = dict(bodies=a_bodies, connections=ns.a_connections, seconds=ns.seconds, headers=auth["A"])
    alone = wrk_load(base, **a_load)
    # B's pause: its connections together ask b_share of A's answered rate
    delay_ms = int(1000 * ns.b_connections / max(ns.b_share * answered(alone), 1e-3))
    b_load = dict(
        bodies=b_bodies, connections=ns.b_connections, seconds=ns.seconds, headers=auth["B"], delay_ms=delay_ms
    )
    quiet = wrk_load(base, **b_load)
    a_flood, b_flooded = side_by_side(base, a_load, b_load)
    return Round(alone, quiet, a_flood, b_flooded, delay_ms)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="all-MiniLM-L6-v2", help="what the worker serves (default: %(default)s)")
    p.add_argument("--seconds", type=float, default=20.0, help="each load's duration (default: %(default)g)")
    p.add_argument("--a-connections", type=int, default=256, help="A's flood (default: %(default)d)")
    p.add_argument("--b-connections", type=int, default=8, help="B's paced connections (default: %(default)d)")
    p.add_argument(
        "--b-share", type=float, default=0.1, help="B's rate ÷ A's single-tenant rate (default: %(default)g)"
    )
    p.add_argument("--rounds", type=int, default=1, help="rounds of the three steps, one worker (default: %(default)d)")
    ns = p.parse_args()
    rounds: list[Round] = []
    with tempfile.TemporaryDirectory(prefix="srun-tenants-") as tmp:
        keys = Path(tmp) / "keys"
        keys.write_text("".join(f"{t} {hashlib.sha256(k.encode()).hexdigest()}\n" for t, k in KEYS.items()))
        # the result cache off: wrk cycles over a fixed set of bodies, and a cache would answer
        # A's flood without a forward (an HTTP-only load; a flood of new texts is what competes)
        with server(ns.model, "--api-key-file", str(keys), "--result-cache-entries", "0") as base:
            auth = {name: {"Authorization": f"Bearer {key}"} for name, key in KEYS.items()}
            wrk_load(base, bodies("A"), connections=8, seconds=2, headers=auth["A"])  # warm-up
            rounds.extend(one_round(base, ns, auth) for _ in range(max(1, ns.rounds)))
    print(f"machine: {machine_load()}; model {ns.model}; {ns.seconds:g} s per load")
    for number, done in enumerate(rounds, 1):
        if len(rounds) > 1:
            print(f"-- round {number}")
        done.report(ns.b_connections)
    if len(rounds) > 1:
        ratios, shares = [r.p99_ratio for r in rounds], [r.a_ratio for r in rounds]
        refused = sum(r.b_flooded.errors for r in rounds)
        print(
            f"over {len(rounds)} rounds: B p99 ÷ quiet median {statistics.median(ratios):.2f} "
            f"(<= 2 in {sum(x <= 2 for x in ratios)}); A ÷ alone median {statistics.median(shares):.2f} "
            f"(>= 0.9 in {sum(x >= 0.9 for x in shares)}); B's 429s {refused}; A's ceiling median "
            f"{statistics.median(r.a_ceiling for r in rounds):.2f}; both ÷ A alone median "
            f"{statistics.median(r.both_ratio for r in rounds):.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
