"""The one-call attention op (`srun_cpu::varlen_attention`, engines/cpu_op_library.py) against the
per-run SDPA of the eager ops (`models/unpadded.ForwardOps.attention`), on the same rows.

Rows of the load benchmarks' three shapes (token counts drawn like MiniLM's tokens of
`_texts.SHAPES`: short 4-28, mixed 4-210, long 200-256), packed the way a merged forward packs
them, for MiniLM's 12 heads of 32 and for 12 heads of 64 (BERT-base-sized heads), at --threads
threads. The two run interleaved over --rounds rounds; printed per shape and head size: the best
time of each, GFLOP/s (the op's 4 x length^2 x hidden multiply-adds, exact work, no padding) and
SDPA's time ÷ the op's (the median over rounds of the ratio within a round).

`--against FILE` adds the op built from another `cpu_forward.cpp` (another commit's: `git show
REV:src/adapters/engines/csrc/cpu_forward.cpp > FILE`), loaded beside ours under its own op
namespace and timed in the same rounds: the op's time ÷ that one's is printed too (old against new
in one process, on the same rows).

`--relative` times MPNet's attention instead: the same rows with a relative position bias (one
value per distance and head, `unpadded.RelativeBias`), `srun_cpu::varlen_attention_biased` against
the per-run SDPA given the bias as its mask (the path MPNet took before the op had a bias).

`--disentangled` times DeBERTa-v3's attention (its 256 position buckets over 512 positions, both
position terms): `srun_cpu::varlen_attention_disentangled` with the layer's tables laid out by
distance against the per-run path it replaces (each run's relative rows multiplied by every query
and key, the [L, L] terms gathered, then SDPA with them as its mask). Each side's per-forward set-up
(the op's tables, the runs' index grids) is built before the clock starts: a forward builds it once
for all its layers (the tables once for many forwards).

    python bench/varlen_attention.py [--threads 1] [--rounds 7] [--against FILE | --relative | --disentangled]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

SHAPES = {"short": (64, 4, 28), "mixed": (16, 4, 210), "long": (8, 200, 256)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--repeats", type=int, default=10, help="calls timed per path and round (the best counts)")
    ap.add_argument("--against", type=Path, help="another cpu_forward.cpp to time beside ours")
    ap.add_argument("--relative", action="store_true", help="with MPNet's relative position bias")
    ap.add_argument("--disentangled", action="store_true", help="DeBERTa-v3's position terms")
    args = ap.parse_args()
    if sum((args.against is not None, args.relative, args.disentangled)) > 1:
        ap.error("--against, --relative and --disentangled are separate runs")

    import torch

    from vllm_srun.adapters.engines.cpu_op_library import VarlenOps, load_varlen_attention
    from vllm_srun.adapters.models.mpnet import distance_buckets
    from vllm_srun.adapters.models.tokenization import Encoded
    from vllm_srun.adapters.models.unpadded import EAGER_OPS, PackedRows, RelativeBias

    why = load_varlen_attention(print)
    if why is not None:
        raise SystemExit(f"the op is not available here: {why}")
    paths = {"op": VarlenOps().attention, "sdpa": EAGER_OPS.attention}
    if args.against is not None:
        paths["against"] = other_build(args.against)
    torch.set_num_threads(args.threads)
    print(f"uptime before: {os.getloadavg()[0]:.2f}; torch {torch.__version__}, {args.threads} thread(s)")
    rng = random.Random(0)

    def best(fn, *call) -> float:  # type: ignore[no-untyped-def]
        fn(*call)
        spent = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            fn(*call)
            spent.append(time.perf_counter() - start)
        return min(spent)

    for heads, dim in ((12, 32), (12, 64)):
        if args.disentangled:
            paths = deberta_paths(heads, dim)
        for shape, (rows, fewest, most) in SHAPES.items():
            lengths = [rng.randint(fewest, most) for _ in range(rows)]
            packed = PackedRows.build([Encoded([1] * n, [0] * n, False, n) for n in lengths])
            qkv = torch.randn(packed.tokens, 3 * heads * dim)
            relative: object = None
            if args.relative:
                buckets = torch.randn(32, heads)  # MPNet's 32 buckets, looked up by distance
                relative = RelativeBias.over(packed.longest, lambda n, t=buckets: t[distance_buckets(n)])
            elif args.disentangled:
                relative = paths["op"].prepare(packed), paths["sdpa"].prepare(packed)  # type: ignore[attr-defined]
            call = (qkv, packed, heads, relative)
            worst = (paths["op"](*call) - paths["sdpa"](*call)).abs().max().item()
            times: dict[str, list[float]] = {name: [] for name in paths}
            ratios: dict[str, list[float]] = {name: [] for name in paths if name != "op"}
            for r in range(args.rounds):
                order = list(paths) if r % 2 == 0 else list(paths)[::-1]
                got = {name: best(paths[name], *call) for name in order}
                for name, seconds in got.items():
                    times[name].append(seconds)
                    if name != "op":
                        ratios[name].append(got["op"] / seconds)
            flops = sum(4 * n * n * heads * dim for n in lengths)
            figures = ", ".join(
                f"{name} {min(spent) * 1e3:.2f} ms ({flops / min(spent) / 1e9:.1f} GFLOP/s)"
                for name, spent in times.items()
            )
            shares = ", ".join(f"op ÷ {name} {statistics.median(rs):.2f}" for name, rs in ratios.items())
            print(
                f"{heads}x{dim} {shape:5s} ({packed.tokens} tokens, {rows} rows): {figures}; {shares}; "
                f"largest difference to SDPA {worst:.1e}"
            )
    print(f"uptime after: {os.getloadavg()[0]:.2f}")


class DebertaPath:
    """One side of `--disentangled`: a DeBERTa-v3-shaped layer's attention, ONE_CALL or per run."""

    def __init__(self, encoder, one_call: bool) -> None:  # type: ignore[no-untyped-def]
        self.encoder, self.layer, self.one_call = encoder, encoder.blocks[0], one_call

    def prepare(self, packed):  # type: ignore[no-untyped-def]
        if self.one_call:
            return self.encoder.distance_tables(packed.longest)[0]
        return {length: self.encoder.run_index(length, "cpu") for _, _, length, _ in packed.runs}

    def __call__(self, qkv, packed, heads, prepared):  # type: ignore[no-untyped-def]
        from functools import partial

        from vllm_srun.adapters.engines.cpu_op_library import VarlenOps
        from vllm_srun.adapters.models.unpadded import attend_runs

        layer = self.layer
        if self.one_call:
            return VarlenOps().disentangled_attention(qkv, packed, heads, layer.scale, prepared[0])
        q, k, v = qkv.view(qkv.shape[0], 3, heads, layer.head_dim).unbind(1)
        return attend_runs(q, k, v, packed, bias=partial(layer.run_bias, prepared[1]), scale=layer.scale)


def deberta_paths(heads: int, dim: int) -> dict[str, DebertaPath]:
    """A one-layer DeBERTa-v3-shaped encoder (random weights, std 1 / sqrt(fan-in)) and its two paths."""
    import torch

    from vllm_srun.adapters.models.deberta_v2 import DebertaV2Encoder
    from vllm_srun.adapters.models.deberta_v2_config import DebertaV2Config

    hidden = heads * dim
    cfg = DebertaV2Config(
        vocab_size=8,
        hidden_size=hidden,
        num_hidden_layers=1,
        num_attention_heads=heads,
        intermediate_size=8,
        relative_attention=True,
        max_relative_positions=512,
        position_buckets=256,
        position_biased_input=False,
        pos_att_type=("p2c", "c2p"),
        share_att_key=True,
        norm_rel_ebd=("layer_norm",),
        embedding_size=hidden,
        attention_head_size=dim,
    )
    encoder = DebertaV2Encoder(cfg).eval()
    with torch.no_grad():
        for name, param in encoder.named_parameters():
            if param.dim() == 2:
                param.normal_(0.0, 1.0 if "embeddings" in name else param.shape[1] ** -0.5)
    encoder.prepare_relative()
    return {"op": DebertaPath(encoder, True), "sdpa": DebertaPath(encoder, False)}


def other_build(source: Path):  # type: ignore[no-untyped-def]
    """The attention op of SOURCE (a cpu_forward.cpp), under the op namespace `srun_cpu_against`."""
    import torch

    from vllm_srun.adapters.engines.cpp_ops import CppOp
    from vllm_srun.adapters.engines.cpu_op_library import OP

    renamed = Path(tempfile.mkdtemp(prefix="srun-against-")) / "cpu_forward_against.cpp"
    renamed.write_text(source.read_text().replace("srun_cpu", "srun_cpu_against"))
    op = CppOp(str(renamed), "attention op to compare", "UNSET", ("srun_cpu_against", "varlen_attention"))
    op.flags = OP.flags
    why = op.load(print)
    if why is not None:
        raise SystemExit(f"--against: {why}")
    call = torch.ops.srun_cpu_against.varlen_attention

    def attention(qkv, packed, heads, _relative=None):  # type: ignore[no-untyped-def]
        return call(qkv, packed.starts, packed.lengths, heads, (qkv.shape[1] // 3 // heads) ** -0.5)

    return attention


if __name__ == "__main__":
    main()
