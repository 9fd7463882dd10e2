"""Load benchmark for /v1/embeddings against a real `vllm-srun serve` process, `wrk` as the client.

N closed-loop connections (default 64) for a fixed time per run, two load shapes: *short* texts
(1–20 words, like routing prompts) and *mixed* texts (1–160 words). Prints requests/s and p50/p99
latency and, measured side by side in the same run:
  - batching ÷ one-row-per-forward (the same server with --max-num-seqs 1),
  - served ÷ offline ceiling (a globally length-sorted encode of the same texts with our
    unpadded engine, in-process, at the server's thread count, while no server runs),
  - a lone request's p50 against one-row forward time + window + 1.5 ms.

    python bench/embeddings_load.py [--connections 64] [--seconds 10] [--shape short|mixed|both]
                                    [--serve-args '--threads 2']
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _load import embeddings_body, machine_load, server, warm_up, wrk_load
from _texts import make_texts


def _model():
    from vllm_srun.adapters.engines.native import native_encoder
    from vllm_srun.adapters.model_store import LocalModelStore
    from vllm_srun.adapters.models.reference_encoder import ReferenceEncoder
    from vllm_srun.adapters.models.tokenization import TextTokenizer

    store = LocalModelStore.from_env()
    folder = store.resolve("all-MiniLM-L6-v2", lambda _m: None)
    reference = ReferenceEncoder.from_folder(folder)
    engine = native_encoder(reference, "cpu", lambda _m: None, cache_dir=store.engine_cache)
    return engine, TextTokenizer.from_folder(folder)


def offline_ceiling(texts: list[str], batch: int = 32) -> float:
    """Texts per second of a length-sorted encode of the same texts (tokenizing included) with the
    engine the server runs, in-process."""
    engine, tok = _model()
    engine.embed(tok.encode(texts[:8], max_length=256, truncate=True))  # warm-up
    start = time.perf_counter()
    encoded = sorted(tok.encode(texts, max_length=256, truncate=True), key=lambda e: -len(e.ids))
    for i in range(0, len(encoded), batch):
        engine.embed(encoded[i : i + batch])
    return len(texts) / (time.perf_counter() - start)


def one_row_forward_ms(text: str, repeats: int = 50) -> float:
    engine, tok = _model()
    enc = tok.encode([text], max_length=256)
    for _ in range(5):
        engine.embed(enc)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        engine.embed(enc)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=10.0, help="seconds of load per run")
    ap.add_argument("--texts", type=int, default=512, help="distinct texts per shape (cycled by wrk)")
    ap.add_argument("--shape", choices=["short", "mixed", "both"], default="both")
    ap.add_argument("--window-ms", type=float, default=2.0)
    ap.add_argument("--engine", default="auto", help="--engine passed to vllm-srun serve (auto|native|onnxruntime)")
    ap.add_argument("--serve-args", default="", help="more flags for vllm-srun serve, e.g. '--threads 1'")
    args = ap.parse_args()
    shapes = ["short", "mixed"] if args.shape == "both" else [args.shape]
    # the result cache is off: repeated texts would be answered without a forward
    extra = [
        "--engine",
        args.engine,
        "--batch-window-ms",
        str(args.window_ms),
        "--result-cache-entries",
        "0",
        *args.serve_args.split(),
    ]

    # the in-process references compute with the server's thread count and OpenMP wait policy
    import os

    from vllm_srun.app.cli import default_threads
    from vllm_srun.domain.worker.threads import WAIT_POLICY_ENV, omp_wait_policy

    flags = args.serve_args.split()
    threads = int(flags[flags.index("--threads") + 1]) if "--threads" in flags else default_threads()
    policy = omp_wait_policy(threads, os.environ)
    if policy is not None:
        os.environ[WAIT_POLICY_ENV] = policy  # before torch loads OpenMP
    import torch

    torch.set_num_threads(threads)
    print(
        f"# embeddings load (wrk): {args.connections} connections, {args.seconds:g} s per run, "
        f"engine {args.engine}, {threads} forward thread(s); {machine_load()}"
    )
    for shape in shapes:
        bodies = [embeddings_body(t) for t in make_texts(shape, args.texts, seed=1)]
        with server(*extra) as base:
            warm_up(base, bodies)
            batched = wrk_load(base, bodies, connections=args.connections, seconds=args.seconds)
        with server(*extra, "--max-num-seqs", "1") as base:
            warm_up(base, bodies)
            single = wrk_load(base, bodies, connections=args.connections, seconds=args.seconds)
        ceiling = offline_ceiling(make_texts(shape, args.texts, seed=1))
        print(f"\n## {shape} texts")
        print(batched.line("batching (defaults)", 22))
        print(single.line("--max-num-seqs 1", 22))
        print(f"{'offline sorted batches':22s} {ceiling:8.1f} texts/s (ceiling)")
        print(f"ratio batching / one-row-per-forward: {batched.rps / single.rps:.2f}x")
        print(f"ratio served / offline ceiling:       {batched.rps / ceiling:.2f}")

    lone_text = "route this request to billing"
    forward_ms = one_row_forward_ms(lone_text)
    with server(*extra) as base:
        body = [embeddings_body(lone_text)]
        warm_up(base, body, 1)
        lone = wrk_load(base, body, connections=1, seconds=min(5.0, args.seconds))
    budget = forward_ms + args.window_ms + 1.5
    print("\n## lone request")
    print(
        f"one-row forward (in-process) {forward_ms:.2f} ms; lone request p50 {lone.p50_ms:.2f} ms; "
        f"budget forward + window + 1.5 ms = {budget:.2f} ms; overhead {lone.p50_ms - forward_ms - args.window_ms:.2f} ms"
    )
    print(f"# after: {machine_load()}")


if __name__ == "__main__":
    main()
