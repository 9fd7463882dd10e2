"""Offline batch jobs: rows/s of `vllm-srun batch` (the model in its own process, `--model`)
against the same corpus served by `vllm-srun serve` and driven by `wrk`, side by side in one run.

The corpus: ROWS /v1/embeddings lines, one text each (`_texts.py`, shape `--shape`), written as
an OpenAI batch input file; wrk cycles over the same bodies for `--seconds` at `--connections`
(default 64: `batch`'s default window). Both sides run the same model with the same serving
flags (`--serve-args`, default `--result-cache-entries 0`: wrk cycles, a cache would answer it).
`batch`'s figure is its summary line's rows/s (answering and writing, model loading excluded);
a third run, `batch --url` against the server, shows the HTTP client's share.

Prints rows/s of each and batch ÷ wrk (target: ≥ 0.9, the batch path costs no more than serving).

    python bench/batch.py [--rows 2000] [--shape short|mixed|long] [--seconds 10]
                          [--connections 64] [--model all-MiniLM-L6-v2] [--serve-args '--threads 2']
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _load import embeddings_body, machine_load, server, warm_up, wrk_load
from _texts import make_texts

SUMMARY = re.compile(r"batch: ([\d,]+) rows written .* \(([\d,.]+) rows/s\)")


def write_corpus(path: Path, texts: list[str]) -> None:
    with path.open("w") as f:
        for i, text in enumerate(texts):
            line = {"custom_id": f"row-{i}", "method": "POST", "url": "/v1/embeddings", "body": {"input": text}}
            f.write(json.dumps(line, separators=(",", ":")) + "\n")


def run_batch(source: Path, out: Path, *target: str, concurrency: int) -> tuple[int, float]:
    """`vllm-srun batch` over SOURCE into a fresh OUT: (rows written, rows/s) from its summary."""
    out.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "vllm_srun.app.cli", "batch", str(source), str(out), *target]
    done = subprocess.run([*cmd, "--concurrency", str(concurrency)], capture_output=True, text=True, check=False)
    found = SUMMARY.search(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "")
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"batch failed (exit {done.returncode}): {done.stderr.strip()[-500:]}")
    return int(found[1].replace(",", "")), float(found[2].replace(",", ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--shape", default="mixed", choices=("short", "mixed", "long"))
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--model", default="all-MiniLM-L6-v2")
    parser.add_argument("--serve-args", default="--result-cache-entries 0")
    parser.add_argument("--skip-url", action="store_true", help="skip `batch --url` against the server")
    args = parser.parse_args()
    flags = shlex.split(args.serve_args)
    texts = make_texts(args.shape, args.rows)
    print(f"before: {machine_load()}")
    with tempfile.TemporaryDirectory(prefix="srun-batch-bench-") as tmp:
        source, out = Path(tmp) / "in.jsonl", Path(tmp) / "out.jsonl"
        write_corpus(source, texts)
        rows, local_rps = run_batch(source, out, "--model", args.model, *flags, concurrency=args.connections)
        print(f"batch --model: {rows} rows, {local_rps:,.1f} rows/s")
        with server(args.model, *flags) as base:
            bodies = [embeddings_body(t) for t in texts]
            warm_up(base, bodies[:64])
            load = wrk_load(base, bodies, connections=args.connections, seconds=args.seconds)
            wrk_rps = load.requests / load.seconds
            print(
                f"serve + wrk -c{args.connections}: {wrk_rps:,.1f} rows/s, p50 {load.p50_ms:.1f} ms, {load.errors} errors"
            )
            if not args.skip_url:
                rows, url_rps = run_batch(source, out, "--url", base, concurrency=args.connections)
                print(f"batch --url (same server): {rows} rows, {url_rps:,.1f} rows/s")
    print(f"batch --model ÷ serve+wrk: {local_rps / wrk_rps:.2f} (target ≥ 0.9)")
    print(f"after: {machine_load()}")


if __name__ == "__main__":
    main()
