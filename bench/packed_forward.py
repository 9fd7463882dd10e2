"""The CPU packed forward, old against new, on the same merged forwards (issue 21, R-BAT-2):

  per-run   rows padded per linear call, one SDPA per run of equal-length rows (the path before);
  pad-once  the forward padded to its bucket once (no linear copies its input), SDPA per run;
  one-call  pad-once, and attention for every row and head in one call (engines/cpu_op_library.py);
  add-norm  one-call, and each residual add + LayerNorm in one pass (the same C++ ops: the serving path).

MiniLM (the embedded default), texts of the load benchmarks' shapes (bench/_texts.py), merged
into forwards of up to --forward-tokens tokens in arrival order as the scheduler does, at
--threads threads. The four run interleaved (a, b, c, then c, b, a, ...) over the same forwards;
printed: texts/s each, and the median over rounds of each one's time ÷ per-run's.

    python bench/packed_forward.py [--threads 1] [--rounds 5] [--forward-tokens 512] [--texts 400]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _texts import SHAPES, make_texts
from peers import model_folder


def forwards(encoded: list, most_tokens: int) -> list[list]:
    out, current, tokens = [], [], 0
    for row in encoded:
        if current and tokens + row.n_tokens > most_tokens:
            out.append(current)
            current, tokens = [], 0
        current.append(row)
        tokens += row.n_tokens
    return [*out, current] if current else out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--forward-tokens", type=int, default=512)
    ap.add_argument("--texts", type=int, default=400)
    args = ap.parse_args()

    import torch

    from vllm_srun.adapters.engines.cpu_onednn import PackedEncoder
    from vllm_srun.adapters.engines.cpu_op_library import cpu_ops
    from vllm_srun.adapters.engines.native import FORCED_UP_TO, NativeEncoder
    from vllm_srun.adapters.models.encoder_arch import hidden_states
    from vllm_srun.adapters.models.reference_encoder import ReferenceEncoder
    from vllm_srun.adapters.models.tokenization import TextTokenizer
    from vllm_srun.adapters.models.unpadded import EAGER_OPS, ForwardOps, PackedRows, pooled
    from vllm_srun.domain.worker.kernels import KernelPlan

    torch.set_num_threads(args.threads)
    folder = model_folder()
    reference = ReferenceEncoder.from_folder(folder)
    tokenizer = TextTokenizer.from_folder(folder)
    packed = PackedEncoder(reference.encoder, reference.head)
    packed.warm(args.forward_tokens)
    ops, attention = cpu_ops(torch.float32, print)

    class AttentionOnly(type(ops)):  # the one-call attention, the eager residual add + norm
        add_norm = ForwardOps.add_norm

    one_call = NativeEncoder(reference, packed, KernelPlan(FORCED_UP_TO), ops=AttentionOnly())
    new = NativeEncoder(reference, packed, KernelPlan(FORCED_UP_TO), ops=ops)
    pad_only = NativeEncoder(reference, packed, KernelPlan(FORCED_UP_TO))
    linears = pad_only.packed_linears

    def per_run(batch: list) -> None:  # the path before: no pad_to, eager ops
        with torch.inference_mode():
            rows = PackedRows.build(batch)
            pooled(hidden_states(reference.encoder, rows, linears, EAGER_OPS), rows, reference.pooling)

    variants = {"per-run": per_run, "pad-once": pad_only.embed, "one-call": one_call.embed, "add-norm": new.embed}
    print(f"# MiniLM, {args.threads} thread(s), forwards of <= {args.forward_tokens} tokens; attention: {attention}")
    for shape in [s for s in ("short", "mixed", "long") if s in SHAPES]:
        texts = make_texts(shape, args.texts, seed=1)
        encoded = tokenizer.encode(texts, 256, True)
        batches = forwards(encoded, args.forward_tokens)
        for fn in variants.values():
            fn(batches[0])
        times: dict[str, list[float]] = {name: [] for name in variants}
        for r in range(args.rounds):
            names = list(variants) if r % 2 == 0 else list(reversed(variants))
            for name in names:
                start = time.perf_counter()
                for batch in batches:
                    variants[name](batch)
                times[name].append(time.perf_counter() - start)
        base = times["per-run"]
        tokens = sum(e.n_tokens for e in encoded)
        print(f"\n## {shape}: {len(texts)} texts, {tokens / len(texts):.0f} tokens each, {len(batches)} forwards")
        for name, spent in times.items():
            ratio = statistics.median(b / t for b, t in zip(base, spent))
            print(f"{name:9s} {len(texts) / statistics.median(spent):8.1f} texts/s   speed-up vs per-run {ratio:5.2f}x")


if __name__ == "__main__":
    main()
