"""Our server against its peers on the same MiniLM folder, both text shapes, one run, `wrk` as the
client (a C client that takes almost no CPU from the server under test).

  - ours:     `vllm-srun serve` with its defaults (result cache off), /v1/embeddings;
  - Infinity: `infinity_emb v2 --engine torch --device cpu` (infinity-emb, in a venv of its own that
              this script creates once: torch==2.13.0 pinned so pip takes the CPU build), /embeddings;
  - offline:  sentence-transformers `encode` of the same texts in-process (its own length sort and
              padded batches), at the best of several batch sizes, run while no server runs.

Prints req/s, p50/p99 per shape, ours ÷ Infinity (target ≥ 2.5) and ours ÷ offline (target ≥ 1.1),
and the achieved GFLOP/s (MiniLM's FLOPs of each request's real tokens × req/s) ÷ this CPU's FP32
peak, with how the peak was derived, plus a measured FP32 matrix-product ceiling. `uptime`'s load
is printed before and after: on a shared machine the figures move with it.

    python bench/peers.py [--seconds 15] [--connections 64] [--shape short|mixed|both]
                          [--venv ~/.cache/vllm-srun/bench/peers-venv] [--skip-infinity] [--skip-offline]
                          [--variant '--concurrent-forwards 2' ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cpu_peak import cpu_count, encoder_flops, fp32_peak, measured_gemm_gflops
from _load import LoadResult, command, embeddings_body, free_port, machine_load, server, warm_up, wrk_load
from _texts import make_texts

MODEL = "all-MiniLM-L6-v2"
DEFAULT_VENV = Path.home() / ".cache" / "vllm-srun" / "bench" / "peers-venv"
PEER_PACKAGES = ["torch==2.13.0", "infinity-emb[server,torch]==0.0.78", "sentence-transformers"]

OFFLINE = textwrap.dedent(
    """
    import json, sys, time
    import torch
    from sentence_transformers import SentenceTransformer
    folder, texts_file, batches = sys.argv[1], sys.argv[2], [int(b) for b in sys.argv[3].split(",")]
    texts = json.load(open(texts_file))
    model = SentenceTransformer(folder, device="cpu")
    model.encode(texts[:32], batch_size=32)  # warm-up
    best = None
    for batch in batches:
        start = time.perf_counter()
        model.encode(texts, batch_size=batch)
        rate = len(texts) / (time.perf_counter() - start)
        if best is None or rate > best[0]:
            best = (rate, batch)
    print(json.dumps({"rate": best[0], "batch": best[1], "threads": torch.get_num_threads(), "max_seq_length": model.max_seq_length}))
    """
)


def ensure_venv(venv: Path) -> Path:
    """The peers' venv (created once): infinity-emb and sentence-transformers on the CPU build of torch."""
    python = venv / "bin" / "python"
    if not (venv / "bin" / "infinity_emb").exists():
        print(f"# installing the peers into {venv} (once): {' '.join(PEER_PACKAGES)}", flush=True)
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *PEER_PACKAGES], check=True)
    return python


def versions(python: Path) -> str:
    code = "import importlib.metadata as m; print(', '.join(f'{p} {m.version(p)}' for p in ('infinity-emb', 'sentence-transformers', 'transformers', 'torch')))"
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def model_folder() -> Path:
    from vllm_srun.adapters.model_store import LocalModelStore
    from vllm_srun.domain.errors import ModelNotFound

    store = LocalModelStore.from_env()
    try:
        return store.resolve(MODEL, lambda _m: None)
    except ModelNotFound:
        return store.pull(MODEL, lambda _m: None)


def gflop_per_request(folder: Path, texts: list[str]) -> tuple[float, float]:
    """(mean GFLOP of one request's real tokens, mean tokens) with MiniLM's tokenizer (256 at most)."""
    from vllm_srun.adapters.models.bert import BertConfig
    from vllm_srun.adapters.models.tokenization import TextTokenizer

    cfg = BertConfig.from_folder(folder)
    lengths = [len(e.ids) for e in TextTokenizer.from_folder(folder).encode(texts, max_length=256, truncate=True)]
    flops = [encoder_flops(n, cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size) for n in lengths]
    return sum(flops) / len(flops) / 1e9, sum(lengths) / len(lengths)


def run_server_shapes(
    base: str, path: str, bodies: dict[str, list[bytes]], args: argparse.Namespace
) -> dict[str, LoadResult]:
    out = {}
    for shape, shape_bodies in bodies.items():
        warm_up(base, shape_bodies, 3, path=path)
        out[shape] = wrk_load(base, shape_bodies, connections=args.connections, seconds=args.seconds, path=path)
        print(f"  {shape}: {out[shape].line('', 0).strip()}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=15.0, help="seconds of wrk load per server and shape")
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--texts", type=int, default=512, help="distinct texts per shape")
    ap.add_argument("--shape", choices=["short", "mixed", "both"], default="both")
    ap.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    ap.add_argument("--batches", default="16,32,64,128", help="offline batch sizes tried (the best is kept)")
    ap.add_argument("--serve-args", default="", help="more flags for vllm-srun serve")
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="FLAGS",
        help="also run our server with these flags (repeatable), e.g. '--concurrent-forwards 2'",
    )
    ap.add_argument("--skip-infinity", action="store_true")
    ap.add_argument("--skip-offline", action="store_true")
    args = ap.parse_args()
    shapes = ["short", "mixed"] if args.shape == "both" else [args.shape]
    folder = model_folder()
    texts = {s: make_texts(s, args.texts, seed=1) for s in shapes}
    python = None if args.skip_infinity and args.skip_offline else ensure_venv(args.venv)
    cores = cpu_count()
    print(f"# peers: {MODEL} ({folder}), wrk {args.connections} connections × {args.seconds:g} s per run, {cores} CPUs")
    print(f"# before: {machine_load()}")
    if python is not None:
        print(f"# peers venv: {versions(python)}")

    results: dict[str, dict[str, LoadResult | float]] = {}
    ours_bodies = {s: [embeddings_body(t) for t in texts[s]] for s in shapes}
    ours_names = []
    for flags in ["", *args.variant]:
        name = "ours" if not flags else f"ours {flags}"
        ours_names.append(name)
        print(f"{name}: vllm-srun serve {flags or '(defaults)'}, result cache off", flush=True)
        with server("--result-cache-entries", "0", *args.serve_args.split(), *flags.split()) as base:
            import urllib.request

            with urllib.request.urlopen(f"{base}/v1/models") as r:
                card = json.load(r)["data"][0]
            threads = card.get("threads", {})
            print(
                f"  card: threads {threads.get('forward')} × {threads.get('concurrent_forwards', 1)} concurrent, wait "
                f"policy {threads.get('omp_wait_policy')}, numerics {card['numerics']}, kernels "
                f"{card.get('kernels', {}).get('linear')} up to {card.get('kernels', {}).get('packed_up_to_tokens')}"
            )
            results[name] = dict(run_server_shapes(base, "/v1/embeddings", ours_bodies, args))

    if not args.skip_infinity:
        assert python is not None
        inf_bodies = {
            s: [json.dumps({"input": [t], "model": MODEL}, separators=(",", ":")).encode() for t in texts[s]]
            for s in shapes
        }
        port = free_port()
        argv = [
            str(python.parent / "infinity_emb"),
            "v2",
            "--model-id",
            str(folder),
            "--served-model-name",
            MODEL,
            "--engine",
            "torch",
            "--device",
            "cpu",
            "--port",
            str(port),
            "--host",
            "127.0.0.1",
            "--log-level",
            "warning",
        ]
        print("Infinity: infinity_emb v2 --engine torch --device cpu (its defaults otherwise)", flush=True)
        with command(argv, port, "infinity_emb", timeout=600) as (base, _pid):
            results["infinity"] = dict(run_server_shapes(base, "/embeddings", inf_bodies, args))

    if not args.skip_offline:
        assert python is not None
        print(f"offline: sentence-transformers encode, batch sizes {args.batches}", flush=True)
        results["offline"] = {}
        for shape in shapes:
            texts_file = Path(os.environ.get("TMPDIR", "/tmp")) / f"srun-peers-{shape}-{os.getpid()}.json"
            texts_file.write_text(json.dumps(texts[shape]))
            try:
                done = subprocess.run(
                    [str(python), "-c", OFFLINE, str(folder), str(texts_file), args.batches],
                    capture_output=True,
                    text=True,
                    check=True,
                )
            finally:
                texts_file.unlink()
            found = json.loads(done.stdout.strip().splitlines()[-1])
            results["offline"][shape] = float(found["rate"])
            print(
                f"  {shape}: {found['rate']:.1f} texts/s at batch {found['batch']} ({found['threads']} torch threads, "
                f"max_seq_length {found['max_seq_length']})",
                flush=True,
            )

    peak = fp32_peak(cores)
    gemm = measured_gemm_gflops(cores)
    print(f"\n# after: {machine_load()}")
    print(f"# FP32 peak: {peak.derivation}")
    print(
        f"# measured FP32 ceiling: {gemm:.0f} GFLOP/s (a 2048×384 × 384×1536 matrix product, best of 10, {cores} threads)"
    )
    for shape in shapes:
        gflop, tokens = gflop_per_request(folder, texts[shape])
        print(f"\n## {shape} texts ({tokens:.1f} tokens, {gflop:.3f} GFLOP per request on average)")
        width = max(12, *(len(n) for n in ours_names))
        print(
            f"{'':{width}s} {'req/s':>8s} {'p50 ms':>9s} {'p99 ms':>9s} {'GFLOP/s':>8s} {'of peak':>8s} {'of gemm':>8s}"
        )
        for name in (*ours_names, "infinity", "offline"):
            got = results.get(name, {}).get(shape)
            if got is None:
                continue
            rps = got.rps if isinstance(got, LoadResult) else float(got)
            lat = f"{got.p50_ms:9.1f} {got.p99_ms:9.1f}" if isinstance(got, LoadResult) else f"{'-':>9s} {'-':>9s}"
            errors = f"  errors {got.errors}" if isinstance(got, LoadResult) and got.errors else ""
            achieved = rps * gflop
            print(
                f"{name:{width}s} {rps:8.1f} {lat} {achieved:8.1f} {achieved / peak.gflops:8.1%} {achieved / gemm:8.1%}{errors}"
            )
        for name in ours_names:
            ours = results[name][shape]
            assert isinstance(ours, LoadResult)
            if "infinity" in results:
                inf = results["infinity"][shape]
                assert isinstance(inf, LoadResult)
                ratio = ours.rps / inf.rps if inf.rps else float("inf")
                print(f"{name} / Infinity: {ratio:.2f}  (target >= 2.5: {'met' if ratio >= 2.5 else 'MISSED'})")
            if "offline" in results:
                ratio = ours.rps / float(results["offline"][shape])
                print(f"{name} / offline:  {ratio:.2f}  (target >= 1.1: {'met' if ratio >= 1.1 else 'MISSED'})")


if __name__ == "__main__":
    main()
