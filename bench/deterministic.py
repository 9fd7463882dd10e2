"""The throughput cost of `--deterministic` against the default mode, `wrk` as the client, one run.

  - MiniLM (encoder; deterministic = packed batch-invariant kernels, rows still merge): short and
    mixed texts, req/s and p50/p99 both ways, alternating rounds;
  - a tiny decision fixture (deterministic = one row per forward): /v1/decisions with 3 questions
    per request, both ways;
and whether the deterministic answers are also the same bits at 1 thread and at the whole budget
(every MiniLM text of both shapes), which the mode does not promise across hosts.

    python bench/deterministic.py [--seconds 10] [--rounds 2] [--connections 64]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _embed import card, embeddings
from _load import LoadResult, embeddings_body, machine_load, merged, server, warm_up, wrk_load
from _texts import WORDS, make_texts


def decision_bodies(n: int) -> list[bytes]:
    out = []
    for i in range(n):
        state = " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(8 + i % 40))
        questions = {
            f"q{k}": {"type": "noul", "instructions": f"is it about {WORDS[(i + k) % len(WORDS)]}"} for k in range(3)
        }
        out.append(json.dumps({"state": state, "questions": questions}, separators=(",", ":")).encode())
    return out


def compare(name: str, default: list[LoadResult], det: list[LoadResult]) -> None:
    d, x = merged(default), merged(det)
    print(d.line(f"{name} default", 28))
    print(x.line(f"{name} --deterministic", 28))
    print(f"{'':28s} deterministic / default: {x.rps / d.rps:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--connections", type=int, default=64)
    args = ap.parse_args()
    from vllm_srun.adapters.workers.cpu_budget import front_cpu_budget
    from vllm_srun.domain.worker.threads import budget_threads

    budget = budget_threads(front_cpu_budget())
    texts = {s: make_texts(s, 512, seed=1) for s in ("short", "mixed")}
    bodies = {s: [embeddings_body(t) for t in texts[s]] for s in texts}
    print(
        f"# --deterministic cost: wrk {args.connections} × {args.seconds:g} s, {args.rounds} rounds; {machine_load()}"
    )
    # both under profile max_speed (merged rows, shared context: what served before profiles), so the
    # ratio is --deterministic's own cost; the default profile, exact, runs rows alone where the probe
    # finds a model approximate (docs/profiles.md)
    modes = {"default": ["--profile", "max_speed"], "deterministic": ["--deterministic", "--profile", "max_speed"]}
    minilm: dict[str, dict[str, list[LoadResult]]] = {m: {"short": [], "mixed": []} for m in modes}
    decision: dict[str, list[LoadResult]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory(prefix="srun-det-") as tmp:
        fixture = Path(tmp) / "tiny-decision"
        subprocess.run(
            [sys.executable, "-m", "vllm_srun.app.cli", "fixture", str(fixture), "--family", "decision"],
            check=True,
            capture_output=True,
        )
        dbodies = decision_bodies(256)
        for round_ in range(args.rounds):
            for mode in modes if round_ % 2 == 0 else list(modes)[::-1]:
                with server("--result-cache-entries", "0", *modes[mode]) as base:
                    if round_ == 0:
                        c = card(base)
                        print(f"  MiniLM {mode}: numerics {c['numerics']}, {c.get('deterministic')}", flush=True)
                    for shape in ("short", "mixed"):
                        warm_up(base, bodies[shape], 2)
                        minilm[mode][shape].append(
                            wrk_load(base, bodies[shape], connections=args.connections, seconds=args.seconds)
                        )
                with server(str(fixture), "--result-cache-entries", "0", *modes[mode]) as base:
                    warm_up(base, dbodies, 2, path="/v1/decisions")
                    decision[mode].append(
                        wrk_load(
                            base, dbodies, connections=args.connections, seconds=args.seconds, path="/v1/decisions"
                        )
                    )
                print(f"  round {round_ + 1}: {mode} done; {machine_load()}", flush=True)
    print(f"\n# after: {machine_load()}")
    for shape in ("short", "mixed"):
        print(f"\n## MiniLM, {shape} texts")
        compare("MiniLM", minilm["default"][shape], minilm["deterministic"][shape])
    print("\n## tiny decision fixture, 3 questions per request")
    compare("decision", decision["default"], decision["deterministic"])
    all_texts = texts["short"] + texts["mixed"]
    answers = {}
    for threads in sorted({1, budget}):
        with server("--deterministic", "--result-cache-entries", "0", "--threads", str(threads)) as base:
            answers[threads] = embeddings(base, all_texts)
    same = all(np.array_equal(answers[1], a) for a in answers.values())
    print(
        f"\n## --deterministic at --threads 1 vs --threads {budget}: {len(all_texts)} MiniLM embeddings "
        f"{'bit-identical' if same else 'DIFFER (the mode fixes one count per server; it does not promise this)'}"
    )


if __name__ == "__main__":
    main()
