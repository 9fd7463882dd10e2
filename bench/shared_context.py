"""Shared context (R-SC) on a realistic decoder: one state, many questions, shared vs unshared.

    python bench/shared_context.py                      # SmolLM2-135M shape, random weights
    python bench/shared_context.py --layers 6 --questions 1,8,32   # shorter
    python bench/shared_context.py --arch qwen3_5       # Qwen3.5-0.8B's text shape (hybrid backbone)

For each question count it times
  unshared — every question run as its own `state + question` row, in padded batches of --rows;
             with many batches only the first --unshared-batches are run and the total is scaled
             (all batches are the same shape, so each costs the same; --unshared-batches 0 runs all),
  branch   — `prefix_kv(state)` once, then `branch_logits` (every question a row attending to the
             state's K/V and itself), the state attended once for all rows (`attend_split`):
             the layout the decision family uses under profile shared_context (or max_speed),
  copies   — the same branch layout with the state's K/V copied into every row (one SDPA call;
             the path off the CPU),
  packed   — `packed_tree_logits` (one row: state then every question, under a tree mask;
             `DecoderLM` only),
and prints the seconds and the speed-up unshared ÷ shared. Each shared answer is checked against
the unshared answers that were run (max |Δ| of the logits).

`--arch qwen3_5` runs the Qwen3.5 hybrid backbone (`Qwen35LM`, Qwen3.5-0.8B's text shape: Gated
DeltaNet layers with one gated full-attention layer in four; `--layers` keeps that order): a
branch continues the state's recurrent state and conv tail (linear layers) and its keys and
values (full layers); unshared rows run back to back without padding.
"""

from __future__ import annotations

import argparse
import time

import torch

from vllm_srun.adapters.models.decoder import DecoderConfig, DecoderLM
from vllm_srun.adapters.models.qwen3_5 import Qwen35LM
from vllm_srun.adapters.models.qwen3_5_config import Qwen35Config

SMOLLM2_135M = dict(
    model_type="llama",
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_layers=30,
    num_heads=9,
    num_kv_heads=3,
    head_dim=64,
    rms_norm_eps=1e-5,
    rope_theta=100000.0,
    max_position_embeddings=8192,
    tie_word_embeddings=True,
)


QWEN3_5_08B = dict(  # Qwen3.5-0.8B's text model as its config.json says it
    model_type="qwen3_5_text",
    vocab_size=248320,
    hidden_size=1024,
    intermediate_size=3584,
    num_hidden_layers=24,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=256,
    linear_conv_kernel_dim=4,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_num_key_heads=16,
    linear_num_value_heads=16,
    rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
    max_position_embeddings=262144,
    tie_word_embeddings=True,
)


def build(arch: str, layers: int | None, seed: int) -> DecoderLM | Qwen35LM:
    if arch == "qwen3_5":
        raw = {**QWEN3_5_08B, "num_hidden_layers": layers or QWEN3_5_08B["num_hidden_layers"]}
        return Qwen35LM.random(Qwen35Config.from_dict(raw), seed=seed)
    return DecoderLM.random(
        DecoderConfig(**{**SMOLLM2_135M, "num_layers": layers or SMOLLM2_135M["num_layers"]}), seed=seed
    )


def _timed(fn):
    started = time.perf_counter()
    out = fn()
    return time.perf_counter() - started, out


def _padded(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
    return ids, mask


def _branch(model: DecoderLM | Qwen35LM, state: list[int], questions: list[list[int]], split: bool) -> torch.Tensor:
    model.split_attention = split
    try:
        return model.branch_logits(model.prefix_kv(state), questions)
    finally:
        model.split_attention = True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--state", type=int, default=512, help="state tokens")
    ap.add_argument("--question-len", type=int, default=20, help="mean question tokens (±4)")
    ap.add_argument("--questions", default="1,8,32,128", help="question counts, comma-separated")
    ap.add_argument("--rows", type=int, default=8, help="rows per unshared batch")
    ap.add_argument("--unshared-batches", type=int, default=1, help="unshared batches run per count (0: all)")
    ap.add_argument("--arch", choices=["llama", "qwen3_5"], default="llama", help="llama: SmolLM2-135M; qwen3_5")
    ap.add_argument("--layouts", default=None, help="shared layouts to time (default: branch,copies[,packed])")
    ap.add_argument("--layers", type=int, default=None, help="layers (default: the model's)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each shared layout; the fastest counts")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    model = build(args.arch, args.layers, args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    vocab = model.config.vocab_size
    state = torch.randint(0, vocab, (args.state,), generator=gen).tolist()
    model.branch_logits(model.prefix_kv(state), [state[:8]] * 4)  # warm-up
    tree = isinstance(model, DecoderLM)
    if tree:
        model.packed_tree_logits(state, [state[:8]] * 4)
    print(
        f"{args.arch}: {model.config.num_layers} layers, hidden {model.config.hidden_size}, "
        f"threads {torch.get_num_threads()}; state {args.state} tokens, questions ~{args.question_len} tokens"
    )
    layouts = [
        name for name in (args.layouts or ("branch,copies,packed" if tree else "branch,copies")).split(",") if name
    ]
    runners = {
        "branch": lambda qs: _branch(model, state, qs, split=True),
        "copies": lambda qs: _branch(model, state, qs, split=False),
        "packed": lambda qs: model.packed_tree_logits(state, qs) if isinstance(model, DecoderLM) else None,
    }
    if "packed" in layouts and not tree:
        raise SystemExit("the packed-tree layout is DecoderLM's only (--layouts branch,copies)")
    print(
        f"{'questions':>9} {'unshared s':>11}"
        + "".join(f" {name + ' s':>9}" for name in layouts)
        + "".join(f" {'unsh/' + name:>12}" for name in layouts)
        + f" {'max|Δ|':>9}"
    )
    for count in [int(n) for n in args.questions.split(",") if n]:
        spread = torch.randint(-4, 5, (count,), generator=gen)
        questions = [
            torch.randint(0, vocab, (max(1, args.question_len + int(d)),), generator=gen).tolist() for d in spread
        ]
        shared = {}
        for name in layouts:
            shared[name] = min(
                (_timed(lambda f=runners[name], q=questions: f(q)) for _ in range(args.repeat)), key=lambda r: r[0]
            )
        batches = [questions[i : i + args.rows] for i in range(0, count, args.rows)]
        run = batches if args.unshared_batches <= 0 else batches[: args.unshared_batches]
        t_unshared, worst = 0.0, 0.0
        for b, batch in enumerate(run):
            ids, mask = _padded([state + q for q in batch])
            took, logits = _timed(lambda ids=ids, mask=mask: model.logits_at(ids, mask))
            t_unshared += took
            lo = b * args.rows
            worst = max(
                [worst] + [(logits - got[lo : lo + len(batch)]).abs().max().item() for _, got in shared.values()]
            )
        t_unshared *= len(batches) / len(run)
        scaled = "*" if len(run) < len(batches) else " "
        print(
            f"{count:>9} {t_unshared:>10.2f}{scaled}"
            + "".join(f" {shared[n][0]:>9.2f}" for n in layouts)
            + "".join(f" {t_unshared / shared[n][0]:>11.1f}x" for n in layouts)
            + f" {worst:>9.1e}",
            flush=True,
        )
    print("* unshared total scaled from the batches run (--unshared-batches 0 runs them all)")


if __name__ == "__main__":
    main()
