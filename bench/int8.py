"""The int8 package of MiniLM (`vllm-srun quantize --int8`) against the FP32 model, offline, in-process.

Both run through our native engine as `serve` builds it (`native_encoder`: FP32 on whatever the
load-time plan picks, oneDNN packed linears or eager; the int8 package on int8 GEMMs), on the bench
texts (`_texts.make_texts(shape, N, seed=1)`), every pass the whole pipeline: tokenize, cut the
rows (arrival order) into the forwards the server would plan (`domain.scheduling.planning.plan_lane`: at most
512 tokens for a model the batch-invariance probe finds exact, else 4,096), run them, pool.
Every round runs each pipeline once per shape, a different one first each round; texts/s are the
best and the median pass, ratios the median over rounds of the ratio within a round (passes of one
round share the machine's load of the moment). Also the cosine of every int8 embedding to the FP32
one (min and mean; aim min ≥ 0.99).

`--ort` adds ONNX Runtime's dynamic int8 as the offline peer runs it (`_ort_offline.py`: the
exported model, its BERT optimizer, `quantize_dynamic`; its best batch size), in this process, in
the same rounds, and prints int8 package ÷ ORT dynamic int8 (aim ≥ 1.2) and ORT int8's cosine to
our FP32 (the same model: our FP32 is within 1e-5 of `transformers`).

    python bench/int8.py [--threads N] [--texts 512] [--rounds 3] [--int8 PACKAGE] [--ort]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _load import machine_load
from _texts import make_texts

SHAPES = ("short", "mixed")
MODEL = "all-MiniLM-L6-v2"


class Pipeline:
    """Texts → rows → the server's forwards on ENGINE → embeddings in input order."""

    def __init__(self, name: str, folder: Path, threads: int, cache: Path) -> None:
        from vllm_srun.adapters.devices.torch_devices import CpuDevice
        from vllm_srun.adapters.engines.native import native_encoder
        from vllm_srun.adapters.models.reference_encoder import ReferenceEncoder
        from vllm_srun.adapters.models.tokenization import TextTokenizer
        from vllm_srun.adapters.readiness.probe import batch_invariant
        from vllm_srun.domain.scheduling.planning import invariant_forward_tokens

        self.name = name
        reference = ReferenceEncoder.from_folder(folder)
        self.engine = native_encoder(reference, CpuDevice(), lambda msg: None, cache_dir=cache)
        self.tokenizer = TextTokenizer.from_folder(folder)
        cfg = reference.config
        self.max_tokens = min(reference.pooling.max_seq_length or cfg.max_tokens, cfg.max_tokens)
        probe = self.tokenizer.encode(
            [" ".join(["word"] * n) for n in (1, 4, 9, 17, 30, 52)], max_length=self.max_tokens, truncate=True
        )
        exact = self.engine.determinism == "batch_invariant" and batch_invariant(
            lambda lane, rows: self.engine.embed(rows), "text", probe
        )
        invariant = invariant_forward_tokens(self.engine.kernel_switch_tokens) if exact else None
        self.limit = invariant or 4096  # the encoder family's CPU cap otherwise
        self.numerics = "exact" if invariant else "approximate"
        self.kernels = self.engine.describe()["kernels"]

    def embed(self, texts: list[str]) -> np.ndarray:
        from vllm_srun.domain.scheduling.lanes import Accounting
        from vllm_srun.domain.scheduling.planning import plan_lane
        from vllm_srun.domain.scheduling.rows import Row

        encoded = self.tokenizer.encode(texts, max_length=self.max_tokens, truncate=True)
        rows = [Row(0, i, len(e.ids), "text", i, e) for i, e in enumerate(encoded)]
        out = np.empty((len(texts), 0), dtype=np.float32)
        for forward in plan_lane(rows, Accounting.PACKED, 8192, self.limit):
            vectors = self.engine.embed([r.payload for r in forward.rows])
            if out.shape[1] == 0:
                out = np.empty((len(texts), vectors.shape[1]), dtype=np.float32)
            out[[r.index for r in forward.rows]] = vectors
        return out


class OrtPipeline:
    """ONNX Runtime's dynamic int8 as `_ort_offline.py` runs it (the exported model, its BERT optimizer,
    `quantize_dynamic`; tokenize, sort, pad per batch, mean-pool), at its best batch size, in this process."""

    def __init__(self, folder: Path, threads: int, work: Path, texts: list[str]) -> None:
        import _ort_offline as ort

        self.name = "ort-int8"
        ort.export(folder, work / "raw.onnx")
        fp32, _ = ort.optimize(work / "raw.onnx", work / "fp32.onnx", folder)
        self.pipe = ort.Pipeline(folder, ort.quantize(fp32, work / "int8.onnx"), threads)
        self.batch = self.pipe.best_rate(texts, [16, 32, 64, 128])[1]

    def embed(self, texts: list[str]) -> np.ndarray:
        return self.pipe.embed(texts, self.batch)


def ort_pipeline(folder: Path, threads: int, work: Path, texts: list[str]) -> OrtPipeline | None:
    if not Path(__file__).with_name("_ort_offline.py").is_file():
        print("# --ort: bench/_ort_offline.py is not here; no ONNX Runtime figures")
        return None
    try:
        return OrtPipeline(folder, threads, work, texts)
    except ImportError as exc:
        print(f"# --ort: ONNX Runtime's peer cannot run here ({exc}); no ONNX Runtime figures")
        return None


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=None, help="forward threads (default: a server's default)")
    ap.add_argument("--texts", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--int8", type=Path, default=None, help="an int8 package of MiniLM (default: quantize it now)")
    ap.add_argument("--ort", action="store_true", help="also run ONNX Runtime's dynamic int8 peer")
    args = ap.parse_args()

    from vllm_srun.app.cli import default_threads
    from vllm_srun.domain.worker.threads import WAIT_POLICY_ENV, omp_wait_policy

    threads = args.threads or default_threads()
    policy = omp_wait_policy(threads, os.environ)
    if policy is not None:
        os.environ[WAIT_POLICY_ENV] = policy  # before torch loads OpenMP, as `serve` does

    import torch

    from vllm_srun.adapters.engines.cpu_int8 import int8_unsupported
    from vllm_srun.adapters.engines.onednn_timing import cpu_model
    from vllm_srun.adapters.model_store import LocalModelStore
    from vllm_srun.adapters.models.quantize_package import write_int8_package

    why = int8_unsupported("cpu", torch.float32)
    if why:
        sys.exit(f"no int8 packages here: {why}")
    torch.set_num_threads(threads)
    store = LocalModelStore.from_env()
    source = store.resolve(MODEL)
    texts = {shape: make_texts(shape, args.texts, seed=1) for shape in SHAPES}
    with tempfile.TemporaryDirectory(prefix="srun-int8-") as tmp:
        folder = args.int8 or write_int8_package(source, Path(tmp) / f"{MODEL}-int8", lambda msg: None).out
        pipes: list = [
            Pipeline("fp32", source, threads, store.engine_cache),
            Pipeline("int8", folder, threads, store.engine_cache),
        ]
        print(
            f"# int8 vs fp32: {MODEL}, {threads} thread(s), {cpu_model()}, torch {torch.__version__}, "
            f"{args.texts} texts a shape; OMP_WAIT_POLICY {os.environ.get(WAIT_POLICY_ENV, 'unset')}; {machine_load()}"
        )
        for p in pipes:
            print(
                f"#   {p.name}: linear {p.kernels.get('linear')}, numerics {p.numerics}, forwards of <= {p.limit} tokens"
            )
        if args.ort:
            ort = ort_pipeline(source, threads, Path(tmp), texts["mixed"])
            if ort is not None:
                pipes.append(ort)
                print(f"#   ort-int8: onnxruntime dynamic int8, batch {ort.batch}")
        rates: dict[str, dict[str, list[float]]] = {p.name: {s: [] for s in SHAPES} for p in pipes}
        vectors: dict[str, dict[str, np.ndarray]] = {p.name: {} for p in pipes}
        with torch.inference_mode():
            for p in pipes:  # warm: tokenizers, primitives of the shapes these texts make
                for shape in SHAPES:
                    vectors[p.name][shape] = p.embed(texts[shape])
            for round_ in range(args.rounds):
                order = pipes[round_ % len(pipes) :] + pipes[: round_ % len(pipes)]  # each goes first in turn
                for shape in SHAPES:
                    for p in order:
                        start = time.perf_counter()
                        p.embed(texts[shape])
                        rates[p.name][shape].append(len(texts[shape]) / (time.perf_counter() - start))
    print(f"# after: {machine_load()}")
    print(
        "# texts/s: best and median pass; ratios: the median over rounds of the ratio within a round "
        "(a round's passes share the machine's load of the moment)"
    )
    for shape in SHAPES:
        print(f"\n## {shape} texts ({args.rounds} rounds)")
        for p in pipes:
            r = rates[p.name][shape]
            print(f"{p.name:9s} best {max(r):8.1f}  median {statistics.median(r):8.1f} texts/s")
        int8 = rates["int8"][shape]
        for other, aim in (("fp32", ""), ("ort-int8", "  (aim >= 1.2)")):
            if other in rates:
                paired = statistics.median(a / b for a, b in zip(int8, rates[other][shape]))
                print(f"int8 / {other}: {paired:.2f} (best / best {max(int8) / max(rates[other][shape]):.2f}){aim}")
        cosine = cosines(vectors["int8"][shape], vectors["fp32"][shape])
        print(f"cosine int8 vs fp32: min {cosine.min():.5f}  mean {cosine.mean():.5f}  (aim: min >= 0.99)")
        if "ort-int8" in vectors:
            theirs = cosines(vectors["ort-int8"][shape], vectors["fp32"][shape])
            print(f"cosine ort-int8 vs our fp32: min {theirs.min():.5f}  mean {theirs.mean():.5f}")


if __name__ == "__main__":
    main()
