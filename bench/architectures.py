"""Every encoder architecture we serve, at MiniLM's size, our server under `wrk` against offline
`transformers` on the same texts, in one run.

For each architecture a random-weight package of all-MiniLM-L6-v2's shape (6 layers, hidden 384,
12 heads, FFN 1536; decoders: the same widths, 6 heads of 64 with 2 KV heads; Qwen3.5 besides:
its Gated DeltaNet layers with 3 key and 6 value heads of 64, one layer in four gated full
attention; `qwen3_5-torch` serves the same package with the C++ ops turned off, its layer loop in
Python on torch's kernels, `VLLM_SRUN_CPU_ATTENTION=0`) is written by our
fixture writer (`families/fixtures/encoder_fixture.write_arch_package`: the architecture's real tokenizer
kind, its config as transformers writes it, sentence-transformers pooling files). Then:
  - ours:    `vllm-srun serve FOLDER --profile PROFILE` (result cache off; `batching` unless
             --profile says otherwise), `wrk` with CONNECTIONS connections for
             SECONDS on /v1/embeddings, one text per request, cycling over TEXTS distinct texts;
  - offline: transformers' `AutoModel` + `AutoTokenizer` in this process, the same texts, sorted by
             length and padded per batch (what sentence-transformers does), pooled as the package
             says, at the best of several batch sizes, run while no server runs, once before and
             once after our load: the better of the two counts.
Prints req/s of both and ours ÷ offline per architecture, with the machine's load before and after.

    python bench/architectures.py [--seconds 10] [--connections 32] [--shape mixed|short]
                                  [--arch bert --arch modernbert ...] [--texts 256] [--profile exact]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _load import embeddings_body, machine_load, process, warm_up, wrk_load
from _texts import WORDS as TEXT_WORDS
from _texts import make_texts

ARCHES = ["bert", "roberta", "xlm-roberta", "distilbert", "mpnet", "deberta-v2", "modernbert", "qwen3", "qwen3_5"]
ARCHES += ["qwen3_5-torch"]
# what an architecture's server runs with besides its package (`qwen3_5-torch`: torch's kernels, no C++ ops)
SERVER_ENV = {"qwen3_5-torch": {"VLLM_SRUN_CPU_ATTENTION": "0"}}
MINILM = {"hidden": 384, "layers": 6, "heads": 12, "intermediate": 1536}
DECODER = {"hidden": 384, "layers": 6, "heads": 6, "kv_heads": 2, "intermediate": 1536}
QWEN3_5 = {**DECODER, "head_dim": 64, "linear_key_heads": 3, "linear_value_heads": 6, "linear_head_dim": 64}
POSITIONS = 512


def write_package(out: Path, arch: str) -> Path:
    from vllm_srun.adapters.families.fixtures.encoder_fixture import write_arch_package

    sizes = QWEN3_5 if arch == "qwen3_5" else DECODER if arch in ("qwen3", "qwen2", "llama") else MINILM
    # the benchmark's words are whole tokens, so a text is about as many tokens as MiniLM makes of it
    write_arch_package(out, arch, "embed", 0, positions=POSITIONS, words=TEXT_WORDS, **sizes)
    condition(out / "model.safetensors")
    return out


def condition(weights: Path) -> None:
    """Every matrix but the embedding tables rescaled to a trained model's size, std 1 / sqrt(fan-in).
    The fixture writer draws them at std 0.3 whatever their width, which suits its tiny test models;
    at MiniLM's width that makes every attention one-hot and FP32 rounding alone moves an answer by
    4e-3 (MPNet), so the load's numerics gate (packed linears within 1e-5 of eager) refused the
    packed linears and the model ran on eager ones: a benchmark of a model no one trains."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(weights))
    for name, t in tensors.items():
        if t.ndim == 2 and "embed" not in name and "relative_attention_bias" not in name:
            tensors[name] = (t / (float(t.std()) * np.sqrt(t.shape[1]))).astype(np.float32)
    save_file(tensors, str(weights))


def bert_package(out: Path) -> Path:
    """all-MiniLM-L6-v2 itself stands for BERT (real weights, same shape)."""
    from vllm_srun.adapters.model_store import LocalModelStore
    from vllm_srun.domain.errors import ModelNotFound

    store = LocalModelStore.from_env()
    try:
        return store.resolve("all-MiniLM-L6-v2", lambda _m: None)
    except ModelNotFound:
        return store.pull("all-MiniLM-L6-v2", lambda _m: None)


def offline_rate(folder: Path, texts: list[str], batches: list[int]) -> tuple[float, int]:
    """Texts/s of transformers' model on FOLDER at the best batch size (mean or last-token pooling
    as the package's pooling config says; the pooling is a small part of the time either way)."""
    import torch
    import transformers

    from vllm_srun.adapters.models.st_modules import load_pooling_config

    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    model = transformers.AutoModel.from_pretrained(str(folder), torch_dtype=torch.float32).eval()
    modes = load_pooling_config(folder).modes
    limit = min(POSITIONS, 256)

    def run(batch: int) -> None:
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        with torch.inference_mode():
            for start in range(0, len(order), batch):
                chunk = [texts[i] for i in order[start : start + batch]]
                enc = tok(chunk, padding=True, truncation=True, max_length=limit, return_tensors="pt")
                hidden = model(**enc).last_hidden_state
                mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                if "lasttoken" in modes:
                    last = enc["attention_mask"].sum(1) - 1
                    pooled = hidden[torch.arange(hidden.shape[0]), last]
                else:
                    pooled = (hidden * mask).sum(1) / mask.sum(1)
                torch.nn.functional.normalize(pooled, dim=-1)

    run(batches[0])  # warm-up
    best = (0.0, batches[0])
    for batch in batches:
        start = time.perf_counter()
        run(batch)
        rate = len(texts) / (time.perf_counter() - start)
        best = max(best, (rate, batch))
    return best


def check_answers(base: str, bodies: list[bytes]) -> None:
    """Every body answers 200 before the load (a refused body would count as an error, not a request)."""
    import urllib.error
    import urllib.request

    for body in bodies:
        request = urllib.request.Request(f"{base}/v1/embeddings", body, {"content-type": "application/json"})
        try:
            urllib.request.urlopen(request, timeout=60).read()
        except urllib.error.HTTPError as exc:
            raise SystemExit(f"bench: {body[:80]!r}… answered {exc.code}: {exc.read()[:300]!r}") from None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--texts", type=int, default=256)
    ap.add_argument("--shape", choices=["short", "mixed"], default="mixed")
    ap.add_argument("--arch", action="append", choices=ARCHES, help="architectures to run (default: all)")
    ap.add_argument("--batches", default="16,32,64", help="offline batch sizes tried (the best is kept)")
    ap.add_argument(
        "--profile",
        default="batching",
        help="our server's --profile (batching: rows of concurrent requests merge on any kernels; exact, the "
        "server's default, asks for the batch-invariant packed kernels at every size)",
    )
    args = ap.parse_args()
    arches = args.arch or ARCHES
    texts = make_texts(args.shape, args.texts, seed=3)
    bodies = [embeddings_body(t) for t in texts]
    batches = [int(b) for b in args.batches.split(",")]
    print(
        f"# architectures at MiniLM's size, {args.shape} texts ({len(texts)} distinct), wrk {args.connections} "
        f"connections × {args.seconds:g} s; offline transformers at batch {batches} (best kept)"
    )
    print(f"# before: {machine_load()}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="srun-arch-") as tmp:
        for arch in arches:
            package = arch.removesuffix("-torch")
            if arch != package and (Path(tmp) / package).exists():
                folder = Path(tmp) / package  # the same package, served another way
            else:
                folder = bert_package(Path(tmp)) if arch == "bert" else write_package(Path(tmp) / package, package)
            before = offline_rate(folder, texts, batches)
            argv = (str(folder), "--result-cache-entries", "0", "--profile", args.profile)
            with process("vllm_srun.app.cli", *argv, env=SERVER_ENV.get(arch)) as (base, _pid):
                check_answers(base, bodies)
                warm_up(base, bodies, 3)
                load = wrk_load(base, bodies, connections=args.connections, seconds=args.seconds)
            # offline again after the load: the better of the two (a shared machine's load comes and goes)
            rate, batch = max(before, offline_rate(folder, texts, batches))
            ours = load.rps if not load.errors else float("nan")
            rows.append((arch, ours, load.p50_ms, load.p99_ms, load.errors, rate, batch))
            print(
                f"  {arch:<12} ours {ours:8.1f} req/s (p50 {load.p50_ms:.0f} ms, p99 {load.p99_ms:.0f} ms, "
                f"{load.errors} errors)  offline {rate:8.1f} texts/s (batch {batch})  ratio {ours / rate:.2f}",
                flush=True,
            )
    print(f"# after: {machine_load()}")
    print("\n| architecture | ours req/s | p99 ms | offline transformers texts/s (batch) | ours ÷ offline |")
    print("|---|---|---|---|---|")
    for arch, ours, _p50, p99, _err, rate, batch in rows:
        print(f"| {arch} | {ours:.1f} | {p99:.0f} | {rate:.1f} ({batch}) | {ours / rate:.2f} |")


if __name__ == "__main__":
    main()
