"""Load benchmark for /v1/embeddings (issue: walking skeleton).

N concurrent clients (default 64) against a real `vllm-srun serve` process, two load shapes:
*short* texts (1–20 words, like routing prompts) and *mixed* texts (1–160 words). Prints
requests/s and p50/p99 latency and, measured side by side in the same run:
  - batching ÷ one-row-per-forward (the same server with --max-num-seqs 1),
  - served ÷ offline ceiling (a sorted-batch encode of the same texts with our model, in-process),
  - a lone request's p50 against one-row forward time + window + 1.5 ms.

    python bench/embeddings_load.py [--clients 64] [--requests 512] [--shape short|mixed|both]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _load import embeddings_body, run_load, server

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
    "this",
    "are",
    "be",
    "it",
    "or",
    "an",
    "have",
    "not",
    "which",
    "but",
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
    "medical",
    "legal",
    "advice",
    "price",
    "plan",
    "upgrade",
    "cancel",
    "subscription",
    "error",
    "crash",
    "login",
    "weather",
    "travel",
    "flight",
    "hotel",
    "booking",
    "review",
    "product",
    "quality",
    "support",
    "agent",
    "human",
    "escalate",
    "urgent",
]


def make_texts(shape: str, n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    hi = 20 if shape == "short" else 160
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, hi))) for _ in range(n)]


def offline_ceiling(texts: list[str], batch: int = 32) -> float:
    """Texts per second of a sorted-batch encode of the same texts with our model (in-process)."""
    from vllm_srun.adapters.model_store import LocalModelStore
    from vllm_srun.adapters.models.reference_encoder import ReferenceEncoder
    from vllm_srun.adapters.models.tokenization import TextTokenizer

    folder = LocalModelStore.from_env().resolve("all-MiniLM-L6-v2")
    reference = ReferenceEncoder.from_folder(folder)
    tok = TextTokenizer.from_folder(folder)
    reference.embed(tok.encode(texts[:8], max_length=256, truncate=True))  # warm-up
    start = time.perf_counter()
    encoded = sorted(tok.encode(texts, max_length=256, truncate=True), key=lambda e: -len(e.ids))
    for i in range(0, len(encoded), batch):
        reference.embed(encoded[i : i + batch])
    return len(texts) / (time.perf_counter() - start)


def one_row_forward_ms(text: str, repeats: int = 50) -> float:
    from vllm_srun.adapters.model_store import LocalModelStore
    from vllm_srun.adapters.models.reference_encoder import ReferenceEncoder
    from vllm_srun.adapters.models.tokenization import TextTokenizer

    folder = LocalModelStore.from_env().resolve("all-MiniLM-L6-v2")
    reference = ReferenceEncoder.from_folder(folder)
    enc = TextTokenizer.from_folder(folder).encode([text], max_length=256)
    for _ in range(5):
        reference.embed(enc)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        reference.embed(enc)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--requests", type=int, default=512, help="requests per load shape")
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

    # the in-process references compute with the same thread count as the server
    import torch

    from vllm_srun.app.cli import default_threads

    flags = args.serve_args.split()
    threads = int(flags[flags.index("--threads") + 1]) if "--threads" in flags else default_threads()
    torch.set_num_threads(threads)
    print(
        f"# embeddings load: {args.clients} clients, {args.requests} requests per shape, engine {args.engine}, "
        f"{threads} forward thread(s)"
    )
    for shape in shapes:
        texts = make_texts(shape, args.requests, seed=1)
        bodies = [embeddings_body(t) for t in texts]
        with server(*extra) as base:
            run_load(base, bodies[:64], 8)  # warm-up
            batched = run_load(base, bodies, args.clients)
        with server(*extra, "--max-num-seqs", "1") as base:
            run_load(base, bodies[:64], 8)
            single = run_load(base, bodies, args.clients)
        ceiling = offline_ceiling(texts)
        print(f"\n## {shape} texts")
        for name, r in (("batching (defaults)", batched), ("--max-num-seqs 1", single)):
            print(
                f"{name:22s} {r.rps:8.1f} req/s  p50 {r.pct(0.5):7.1f} ms  p99 {r.pct(0.99):7.1f} ms  errors {r.errors}"
            )
        print(f"{'offline sorted batches':22s} {ceiling:8.1f} texts/s (ceiling)")
        print(f"ratio batching / one-row-per-forward: {batched.rps / single.rps:.2f}x")
        print(f"ratio served / offline ceiling:       {batched.rps / ceiling:.2f}")

    lone_text = "route this request to billing"
    forward_ms = one_row_forward_ms(lone_text)
    with server(*extra) as base:
        body = embeddings_body(lone_text)
        run_load(base, [body] * 20, 1)
        lone = run_load(base, [body] * 200, 1)
    budget = forward_ms + args.window_ms + 1.5
    print("\n## lone request")
    print(
        f"one-row forward (in-process) {forward_ms:.2f} ms; lone request p50 {lone.pct(0.5):.2f} ms; "
        f"budget forward + window + 1.5 ms = {budget:.2f} ms; overhead {lone.pct(0.5) - forward_ms - args.window_ms:.2f} ms"
    )


if __name__ == "__main__":
    main()
