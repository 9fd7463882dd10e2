"""The Qwen3.5 hybrid backbone on a CPU: our decision forwards against offline `transformers`, and
the shared-context break-even (R-SC-2), in one run.

A random-weight model of Qwen3.5-0.8B's text shape (24 layers: Gated DeltaNet, one gated
full-attention layer in four; hidden 1024; vocabulary 248,320; `--layers` keeps that order) is
built by `transformers` (`Qwen3_5ForCausalLM`, its weights disturbed so no norm sits at its
initial value), saved, and read back by ours (`Qwen35LM`). Then, on the same prompts (ROWS rows of
about TOKENS random tokens, ±25 %):
  - ours:    the decision family's unshared forward: next-token logits after each row's last
             token, the rows laid back to back without padding (`logits_at`, all rows at once),
             on three sets of kernels (`qwen3_5_kernels.py`): `stack`, what a CPU serves FP32 on
             (every layer in one C++ call, the C++ delta rule and convolution); `loop`, the Python
             layer loop on the same C++ kernels (the stack must give its bits: checked); `torch`,
             the Python loop on torch's kernels (the chunked delta rule);
  - offline: transformers' forward over left-padded batches (its attention mask; only the last
             position's logits computed: `logits_to_keep=1`), at the best of several batch sizes;
each timed REPEATS times, interleaved, the fastest counting; prints rows/s of each, ours ÷ offline
for each of ours (offline at its best batch size) and stack ÷ torch, with the largest difference
of the logits. Then the break-even of R-SC-2 on the stack, as the decision family measures it at
load (one request both ways: a 32-token state, four 8-token questions, best of REPEATS), and at a
decision-sized request (a STATE-token state, QUESTIONS questions of about 20 tokens), each as
tokens and as the speed-up.

    python bench/qwen3_5.py [--layers 24] [--rows 16] [--tokens 128] [--batches 4,8,16]
                            [--state 512] [--questions 8] [--threads 0] [--kernels stack,loop,torch]

transformers here runs its torch fallbacks for the delta rule and the convolution (no `fla`, no
`causal-conv1d` on a CPU), as it would on any CPU.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from vllm_srun.adapters.engines.cpu_hybrid import CppHybridKernels
from vllm_srun.adapters.engines.cpu_op_library import load_varlen_attention
from vllm_srun.adapters.models.qwen3_5 import Qwen35LM
from vllm_srun.adapters.models.qwen3_5_kernels import TORCH_KERNELS
from vllm_srun.domain.scheduling.shared_context import break_even_tokens

sys.path.insert(0, str(Path(__file__).resolve().parent))

from shared_context import QWEN3_5_08B  # Qwen3.5-0.8B's text model as its config.json says it

TEXT_08B = {k: v for k, v in QWEN3_5_08B.items() if k != "model_type"}  # as transformers' config takes it


def load() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def build(folder: str, layers: int, seed: int):
    import transformers

    torch.manual_seed(seed)
    config = transformers.Qwen3_5TextConfig(**{**TEXT_08B, "num_hidden_layers": layers})
    ref = transformers.Qwen3_5ForCausalLM(config).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    ref.save_pretrained(folder)
    return ref, Qwen35LM.from_pretrained(folder)


def offline(ref, rows: list[list[int]], batch: int) -> torch.Tensor:
    """transformers over left-padded batches: last-position logits [rows, vocab]."""
    out = []
    with torch.inference_mode():
        for lo in range(0, len(rows), batch):
            part = rows[lo : lo + batch]
            width = max(map(len, part))
            ids = torch.zeros(len(part), width, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for i, r in enumerate(part):
                ids[i, width - len(r) :], mask[i, width - len(r) :] = torch.tensor(r), 1
            out.append(ref(input_ids=ids, attention_mask=mask, logits_to_keep=1, use_cache=False).logits[:, -1])
    return torch.cat(out)


def ours_rows(lm: Qwen35LM, rows: list[list[int]]) -> torch.Tensor:
    """The decision family's unshared forward: right-padded ids, each row's last position."""
    width = max(map(len, rows))
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
    return lm.logits_at(ids, positions=torch.tensor([len(r) - 1 for r in rows]))


def timed(fn):
    started = time.perf_counter()
    out = fn()
    return time.perf_counter() - started, out


def break_even(lm: Qwen35LM, state: list[int], questions: list[list[int]], repeats: int) -> tuple[int, float]:
    """R-SC-2's measurement (`DecisionModel.measure_break_even`): (break-even tokens, unshared ÷ shared)."""
    rows = [state + q for q in questions]
    t_unshared = min(timed(lambda: ours_rows(lm, rows))[0] for _ in range(repeats))
    t_shared = min(timed(lambda: lm.branch_logits(lm.prefix_kv(state), questions))[0] for _ in range(repeats))
    tokens = break_even_tokens(t_unshared, sum(map(len, rows)), t_shared, len(state) + sum(map(len, questions)))
    return tokens, t_unshared / t_shared


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--rows", type=int, default=16, help="prompts of the throughput run")
    ap.add_argument("--tokens", type=int, default=128, help="mean prompt tokens (±25 %%)")
    ap.add_argument("--batches", default="4,8,16", help="transformers batch sizes tried (the best is kept)")
    ap.add_argument("--state", type=int, default=512, help="state tokens of the decision-sized break-even")
    ap.add_argument("--questions", type=int, default=8, help="questions of the decision-sized break-even")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kernels", default="stack,loop,torch", help="which of ours to time (stack, loop, torch)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    why = load_varlen_attention(print)
    if why is not None:
        raise SystemExit(f"the C++ kernels are not here: {why}")
    kernels = {"stack": CppHybridKernels(), "loop": CppHybridKernels(stack=False), "torch": TORCH_KERNELS}
    kernels = {name: kernels[name] for name in args.kernels.split(",") if name}
    print(f"# before: {load()}")
    gen = torch.Generator().manual_seed(args.seed)
    vocab = TEXT_08B["vocab_size"]
    spread = max(1, args.tokens // 4)
    rows = [
        torch.randint(0, vocab, (args.tokens + int(d),), generator=gen).tolist()
        for d in torch.randint(-spread, spread + 1, (args.rows,), generator=gen)
    ]
    with tempfile.TemporaryDirectory(prefix="srun-qwen3_5-") as folder:
        ref, lm = build(folder, args.layers, args.seed)
    print(
        f"# Qwen3.5-0.8B text shape, {args.layers} layers, threads {torch.get_num_threads()}; "
        f"{args.rows} rows of ~{args.tokens} tokens"
    )
    for k in kernels.values():  # warm-up
        lm.kernels = k
        ours_rows(lm, rows[:2])
    offline(ref, rows[:2], 2)
    # interleaved, best of REPEATS each: a shared machine's load comes and goes
    batches = [int(b) for b in args.batches.split(",") if b]
    ours_best: dict[str, tuple[float, torch.Tensor]] = {}
    offline_best: dict[int, tuple[float, torch.Tensor]] = {}
    for _ in range(args.repeats):
        for name, k in kernels.items():
            lm.kernels = k
            took, out = timed(lambda: ours_rows(lm, rows))
            if name not in ours_best or took < ours_best[name][0]:
                ours_best[name] = (took, out)
        for batch in batches:
            took, out = timed(lambda b=batch: offline(ref, rows, b))
            if batch not in offline_best or took < offline_best[batch][0]:
                offline_best[batch] = (took, out)
    for batch, (took, _) in offline_best.items():
        print(f"  offline batch {batch:>3}: {args.rows / took:7.2f} rows/s")
    batch = min(offline_best, key=lambda b: offline_best[b][0])
    t_ref, expected = offline_best[batch]
    print(f"offline transformers {args.rows / t_ref:7.2f} rows/s (its best batch, {batch})")
    for name, (took, got) in ours_best.items():
        worst = (got - expected).abs().max().item()
        print(
            f"ours, {name:<5} {args.rows / took:7.2f} rows/s   ours ÷ offline {t_ref / took:.2f}   "
            f"max|Δ logits| {worst:.1e}"
        )
    if "stack" in ours_best and "loop" in ours_best:
        print(f"stack and loop the same bits: {torch.equal(ours_best['stack'][1], ours_best['loop'][1])}")
    if "stack" in ours_best and "torch" in ours_best:
        print(f"stack ÷ torch kernels: {ours_best['torch'][0] / ours_best['stack'][0]:.2f}x faster")
    lm.kernels = next(iter(kernels.values()))  # the break-even on the first kernels asked (the stack)
    state = [(31 * i + 5) % vocab for i in range(32)]
    questions = [[(17 * i + 11 * j + 2) % vocab for i in range(8)] for j in range(4)]
    tokens, speedup = break_even(lm, state, questions, args.repeats)
    print(
        f"break-even ({lm.kernels.name}{'' if getattr(lm.kernels, 'stack', True) else ', loop'}) at load's case "
        f"(32-token state, 4 × 8-token questions): {tokens} tokens; shared {speedup:.2f}x"
    )
    state = torch.randint(0, vocab, (args.state,), generator=gen).tolist()
    questions = [torch.randint(0, vocab, (20,), generator=gen).tolist() for _ in range(args.questions)]
    tokens, speedup = break_even(lm, state, questions, 1)
    print(
        f"break-even at a {args.state}-token state, {args.questions} × 20-token questions: {tokens} tokens; "
        f"shared {speedup:.1f}x faster"
    )
    print(f"# after: {load()}")


if __name__ == "__main__":
    main()
