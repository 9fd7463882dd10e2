"""oneDNN fast path benchmark (R-DT-3 b): MiniLM encoder forwards, eager vs pre-packed linears.

For every shape of a grid (rows × tokens, every row full length), times on the same inputs the
serving forward of the native engine (rows back to back, attention per run, mean pooling):
  eager   on the reference linears (F.linear, then GELU),
  packed  on the oneDNN pre-packed copies (fused GELU, bucketed row counts),
and prints their medians over interleaved repetitions (eager, packed, packed, eager, ...) and
the median of the pairs' ratios eager ÷ packed. `served` is the path the load-time plan picks
for that shape (the plan a server computes: timings of one layer's linears,
`domain.worker.kernels.plan_kernels`), and `served×` the ratio that path gives (1.00 where it keeps
eager). Targets: packed ≥ 1.5× on
one-row forwards of ≤ 32 tokens; served× ≥ 1 everywhere (within the noise of a shared machine).

    python bench/onednn.py [--threads N] [--rows 1,2,4,8,16,32,64] [--tokens 8,16,32,64,128,256]
                           [--seconds 0.3] [--fresh-plan]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def interleaved(eager, packed, seconds: float, min_reps: int = 5, max_reps: int = 61) -> tuple[float, float, float]:
    """(median eager s, median packed s, median of the pairs' eager/packed ratios): the two run
    back to back, in alternating order, until SECONDS are spent. A pair shares the machine's
    load of the moment, so its ratio is steadier than a ratio of medians on a shared CPU."""
    eager(), packed()  # warm (oneDNN builds its primitive for the shape)
    pairs: list[tuple[float, float]] = []
    start = time.perf_counter()
    while len(pairs) < max_reps and (len(pairs) < min_reps or time.perf_counter() - start < seconds):
        t = {}
        for name, fn in (("e", eager), ("p", packed)) if len(pairs) % 2 == 0 else (("p", packed), ("e", eager)):
            t0 = time.perf_counter()
            fn()
            t[name] = time.perf_counter() - t0
        pairs.append((t["e"], t["p"]))
    return (
        statistics.median(e for e, _ in pairs),
        statistics.median(p for _, p in pairs),
        statistics.median(e / p for e, p in pairs),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=None, help="forward threads (default: a server's default)")
    ap.add_argument("--rows", type=_ints, default=[1, 2, 4, 8, 16, 32, 64])
    ap.add_argument("--tokens", type=_ints, default=[8, 16, 32, 64, 128, 256])
    ap.add_argument("--seconds", type=float, default=0.3, help="time budget per shape (at least 3 repetitions)")
    ap.add_argument("--fresh-plan", action="store_true", help="measure the plan now instead of reading the cache")
    args = ap.parse_args()

    import torch

    from vllm_srun.adapters.engines.cpu_onednn import PackedEncoder, onednn_unsupported
    from vllm_srun.adapters.engines.native import FORCED_UP_TO, NativeEncoder
    from vllm_srun.adapters.engines.onednn_timing import cpu_model, measure
    from vllm_srun.adapters.model_store import LocalModelStore
    from vllm_srun.adapters.models.reference_encoder import ReferenceEncoder
    from vllm_srun.adapters.models.tokenization import Encoded
    from vllm_srun.app.cli import default_threads
    from vllm_srun.domain.scheduling.planning import BATCH_INVARIANT_TOKENS
    from vllm_srun.domain.worker.kernels import KernelPlan, plan_kernels

    threads = args.threads or default_threads()
    torch.set_num_threads(threads)
    unsupported = onednn_unsupported("cpu", torch.float32)
    if unsupported:
        sys.exit(f"no oneDNN fast path here: {unsupported}")
    store = LocalModelStore.from_env()
    reference = ReferenceEncoder.from_folder(store.resolve("all-MiniLM-L6-v2"))
    packed = PackedEncoder(reference.encoder, reference.head)
    cache = None if args.fresh_plan else store.engine_cache
    timings, source = measure(reference, packed, 4096, cache, lambda msg: None)
    plan = plan_kernels(timings, exact_tokens=BATCH_INVARIANT_TOKENS)
    print(f"# oneDNN fast path: all-MiniLM-L6-v2, {threads} thread(s), {cpu_model()}, torch {torch.__version__}")
    print(
        f"# plan ({source} timings): packed up to {plan.fast_up_to} tokens; layer-linear speedups "
        + " ".join(f"{t.tokens}:{t.speedup:.2f}" for t in timings)
    )
    print(
        f"# medians of interleaved repetitions (at least 5 pairs, about {args.seconds:g} s per shape); "
        "packed× = median of the pairs' eager/packed\n"
    )
    print(f"{'rows':>4} {'tokens':>6} {'eager ms':>9} {'packed ms':>9} {'packed×':>8} {'served':>7} {'served×':>8}")
    # the serving forward (rows back to back, pooled) on eager linears vs on the packed copies
    eager_engine = NativeEncoder(reference)
    packed_engine = NativeEncoder(reference, packed, KernelPlan(FORCED_UP_TO))
    gen = torch.Generator().manual_seed(0)
    worst, short_one_row = float("inf"), []
    with torch.inference_mode():
        for rows in args.rows:
            for tokens in args.tokens:
                ids = torch.randint(1000, reference.config.vocab_size, (rows, tokens), generator=gen).tolist()
                batch = [Encoded(row, [0] * tokens, False, tokens) for row in ids]
                eager_s, packed_s, ratio = interleaved(
                    lambda batch=batch: eager_engine.embed(batch),
                    lambda batch=batch: packed_engine.embed(batch),
                    args.seconds,
                )
                fast = plan.use_fast(rows * tokens)
                served = ratio if fast else 1.0
                worst = min(worst, served)
                if rows == 1 and tokens <= 32:
                    short_one_row.append(ratio)
                print(
                    f"{rows:>4} {tokens:>6} {eager_s * 1e3:>9.2f} {packed_s * 1e3:>9.2f} {ratio:>7.2f}x "
                    f"{'packed' if fast else 'eager':>7} {served:>7.2f}x",
                    flush=True,
                )
    if short_one_row:
        print(
            f"\none-row forwards of <= 32 tokens: packed {min(short_one_row):.2f}x .. {max(short_one_row):.2f}x "
            f"(target >= 1.5x)"
        )
    print(
        f"served path, worst shape: {worst:.2f}x eager (target >= 1.00x; a shared machine moves single "
        f"shapes by a few %)"
    )


if __name__ == "__main__":
    main()
