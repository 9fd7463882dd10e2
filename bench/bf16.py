"""`--dtype bfloat16` against FP32 on MiniLM, same server otherwise, `wrk` as the client, one run.

Prints req/s and p50/p99 of both on short and mixed texts (alternating rounds, so drift hits both),
the ratio BF16 ÷ FP32 (aim: ≥ 1.5 on mixed texts), and the cosine of every embedding of the texts
(each distinct text of both shapes) served in BF16 against the same text served in FP32 (aim: every
cosine ≥ 0.999), with the card's kernels. On a CPU without native BF16 (no avx512_bf16/amx_bf16)
BF16 is emulated; the script says so and measures anyway.

    python bench/bf16.py [--seconds 10] [--rounds 2] [--connections 64]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _embed import card, embeddings
from _load import LoadResult, embeddings_body, machine_load, merged, server, warm_up, wrk_load
from _texts import make_texts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--texts", type=int, default=512)
    args = ap.parse_args()
    from vllm_srun.adapters.devices.cpu_features import cpu_has_native_bf16

    native = cpu_has_native_bf16()
    texts = {s: make_texts(s, args.texts, seed=1) for s in ("short", "mixed")}
    bodies = {s: [embeddings_body(t) for t in texts[s]] for s in texts}
    print(
        f"# bf16 vs fp32: MiniLM, wrk {args.connections} × {args.seconds:g} s, {args.rounds} rounds; native BF16: "
        f"{native}; {machine_load()}"
    )
    # the same scheduling both ways (rows of concurrent requests merged); bfloat16 needs max_speed
    modes = {"float32": ["--profile", "batching"], "bfloat16": ["--dtype", "bfloat16", "--profile", "max_speed"]}
    results: dict[str, dict[str, list[LoadResult]]] = {m: {"short": [], "mixed": []} for m in modes}
    vectors: dict[str, np.ndarray] = {}
    for round_ in range(args.rounds):
        for mode in modes if round_ % 2 == 0 else list(modes)[::-1]:
            with server("--result-cache-entries", "0", *modes[mode]) as base:
                if mode not in vectors:
                    kernels = card(base).get("kernels", {})
                    print(
                        f"  {mode}: kernels {kernels.get('linear')} ({kernels.get('dtype', 'float32')}), "
                        f"packed up to {kernels.get('packed_up_to_tokens')}",
                        flush=True,
                    )
                    vectors[mode] = embeddings(base, texts["short"] + texts["mixed"])
                for shape in ("short", "mixed"):
                    warm_up(base, bodies[shape], 2)
                    results[mode][shape].append(
                        wrk_load(base, bodies[shape], connections=args.connections, seconds=args.seconds)
                    )
            print(f"  round {round_ + 1}: {mode} done; {machine_load()}", flush=True)
    print(f"\n# after: {machine_load()}")
    for shape in ("short", "mixed"):
        f32, b16 = merged(results["float32"][shape]), merged(results["bfloat16"][shape])
        print(f"\n## {shape} texts")
        print(f32.line("float32", 10))
        print(b16.line("bfloat16", 10))
        aim = " (aim >= 1.5)" if shape == "mixed" else ""
        print(f"bfloat16 / float32: {b16.rps / f32.rps:.2f}{aim}")
    a, b = vectors["bfloat16"].astype(np.float64), vectors["float32"].astype(np.float64)
    cosine = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    print(f"\n## cosine of every embedding, bfloat16 vs float32 ({len(cosine)} texts)")
    print(f"min {cosine.min():.6f}  median {np.median(cosine):.6f}  below 0.999: {(cosine < 0.999).sum()}  (aim: none)")


if __name__ == "__main__":
    main()
