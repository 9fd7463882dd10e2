"""Offline ONNX Runtime peer of `bench/peers.py`: the model as a user of ONNX Runtime would run it.

Run as a script (in its own process, while no server runs), by a python that has onnxruntime,
onnx, torch, transformers and tokenizers (our venv with the `test` or `bench` extra):

    python bench/_ort_offline.py FOLDER TEXTS.json --threads N [--batches 16,32,64,128] [--work DIR]

TEXTS.json is `{shape: [text, ...]}`. Steps:
  1. export FOLDER's `transformers` BertModel (token embeddings out) with torch's TorchScript
     exporter (opset 17, dynamic batch and sequence axes);
  2. FP32: onnxruntime's transformer optimizer for BERT (`onnxruntime.transformers.optimizer`,
     model_type "bert": Attention, SkipLayerNormalization, BiasGelu... fusions), the fused node
     counts reported; where the optimizer is missing the plain export is used and that is said;
  3. int8: `onnxruntime.quantization.quantize_dynamic` of the optimized graph (int8 weights,
     activations quantized per call);
  4. per shape and graph: texts/s of the whole pipeline (tokenize, sort by length, pad per batch,
     run, mean-pool over the mask, L2-normalize: what the package's sentence-transformers modules
     do) at each batch size, the best kept; the int8 embeddings' cosine to the FP32 ones, and the
     FP32 graph's largest difference from the torch module it was exported from (16 texts a shape).
Prints one JSON document on its last line.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

OPSET = 17


def export(folder: Path, path: Path):
    """Write the token-embeddings graph to PATH; returns the torch module it was traced from."""
    import torch
    from transformers import AutoModel

    bert = AutoModel.from_pretrained(str(folder), attn_implementation="eager").eval()

    class TokenEmbeddings(torch.nn.Module):  # keyword arguments: BertModel's positional order varies by release
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask, token_type_ids):
            out = self.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            return out.last_hidden_state

    model = TokenEmbeddings().eval()
    ids = torch.full((2, 8), 1000, dtype=torch.long)
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 4:] = 0
    types = torch.zeros(2, 8, dtype=torch.long)
    axes = {n: {0: "batch", 1: "tokens"} for n in ("input_ids", "attention_mask", "token_type_ids")}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (ids, mask, types),
            str(path),
            dynamo=False,
            input_names=["input_ids", "attention_mask", "token_type_ids"],
            output_names=["last_hidden_state"],
            dynamic_axes={**axes, "last_hidden_state": {0: "batch", 1: "tokens"}},
            opset_version=OPSET,
            do_constant_folding=True,
        )
    return model


def torch_reference(model, pipe: Pipeline, texts: list[str]) -> np.ndarray:
    """The same pooled, normalized embeddings from the torch module the graph was exported from."""
    import torch

    out = []
    with torch.no_grad():
        for e in pipe.tokenizer.encode_batch(texts):
            ids = torch.tensor([e.ids])
            mask = torch.ones_like(ids)
            hidden = model(ids, mask, torch.zeros_like(ids))[0].mean(0)
            out.append((hidden / hidden.norm()).numpy())
    return np.stack(out)


def optimize(raw: Path, out: Path, folder: Path) -> tuple[Path, dict[str, int] | str]:
    """(graph to run as FP32, fused-op counts or why there are none)."""
    try:
        from onnxruntime.transformers.optimizer import optimize_model
    except ImportError as exc:
        return raw, f"onnxruntime.transformers.optimizer unavailable ({exc}); plain export used"
    cfg = json.loads((folder / "config.json").read_text())
    opt = optimize_model(
        str(raw), model_type="bert", num_heads=cfg["num_attention_heads"], hidden_size=cfg["hidden_size"]
    )
    opt.save_model_to_file(str(out))
    return out, {k: int(v) for k, v in opt.get_fused_operator_statistics().items() if v}


def quantize(fp32: Path, out: Path) -> Path:
    from onnx import TensorProto
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # the fused graph's contrib ops (Attention, SkipLayerNormalization...) defeat ONNX shape inference;
    # the quantizer is told their outputs are FP32, which they are
    quantize_dynamic(
        str(fp32), str(out), weight_type=QuantType.QInt8, extra_options={"DefaultTensorType": TensorProto.FLOAT}
    )
    return out


class Pipeline:
    """Tokenize → sorted, per-batch padded inputs → session → mean pooling → L2 norm."""

    def __init__(self, folder: Path, graph: Path, threads: int) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        st = folder / "sentence_bert_config.json"
        self.max_tokens = int(json.loads(st.read_text()).get("max_seq_length", 256)) if st.exists() else 256
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(self.max_tokens)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])
        self.inputs = {i.name for i in self.session.get_inputs()}

    def embed(self, texts: list[str], batch: int) -> np.ndarray:
        encoded = self.tokenizer.encode_batch(texts)
        order = sorted(range(len(texts)), key=lambda i: -len(encoded[i].ids))
        out = np.empty((len(texts), 0), dtype=np.float32)
        for start in range(0, len(order), batch):
            chunk = [encoded[i] for i in order[start : start + batch]]
            width = max(len(e.ids) for e in chunk)
            ids = np.zeros((len(chunk), width), dtype=np.int64)
            mask = np.zeros_like(ids)
            for row, e in enumerate(chunk):
                ids[row, : len(e.ids)] = e.ids
                mask[row, : len(e.ids)] = 1
            feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
            hidden = self.session.run(None, {k: v for k, v in feed.items() if k in self.inputs})[0]
            m = mask[:, :, None].astype(np.float32)
            pooled = (hidden * m).sum(1) / np.maximum(m.sum(1), 1e-9)
            pooled /= np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
            if out.shape[1] == 0:
                out = np.empty((len(texts), pooled.shape[1]), dtype=np.float32)
            out[order[start : start + batch]] = pooled
        return out

    def best_rate(self, texts: list[str], batches: list[int]) -> tuple[float, int]:
        self.embed(texts[:64], max(batches))  # warm-up
        best = (0.0, batches[0])
        for batch in batches:
            start = time.perf_counter()
            self.embed(texts, batch)
            rate = len(texts) / (time.perf_counter() - start)
            best = max(best, (rate, batch))
        return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path)
    ap.add_argument("texts", type=Path)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--batches", default="16,32,64,128")
    ap.add_argument("--work", type=Path, default=None, help="folder for the graphs (default: a temporary one)")
    args = ap.parse_args()
    import onnxruntime as ort

    texts: dict[str, list[str]] = json.loads(args.texts.read_text())
    batches = [int(b) for b in args.batches.split(",") if b]
    with tempfile.TemporaryDirectory(prefix="srun-ort-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        model = export(args.folder, work / "raw.onnx")
        fp32, fusions = optimize(work / "raw.onnx", work / "fp32.onnx", args.folder)
        int8 = quantize(fp32, work / "int8.onnx")
        prepare_s = time.perf_counter() - t0
        result: dict = {
            "onnxruntime": ort.__version__,
            "threads": args.threads,
            "fusions": fusions,
            "prepare_s": prepare_s,
            "fp32": {},
            "int8": {},
            "cosine_int8_vs_fp32": {},
            "fp32_max_abs_vs_torch": {},
        }
        pipelines = {
            "fp32": Pipeline(args.folder, fp32, args.threads),
            "int8": Pipeline(args.folder, int8, args.threads),
        }
        for shape, shape_texts in texts.items():
            vectors = {}
            for name, pipe in pipelines.items():
                rate, batch = pipe.best_rate(shape_texts, batches)
                result[name][shape] = {"rate": rate, "batch": batch}
                vectors[name] = pipe.embed(shape_texts, batch)
                print(f"# ort {name} {shape}: {rate:.1f} texts/s at batch {batch}", file=sys.stderr, flush=True)
            cos = (vectors["fp32"] * vectors["int8"]).sum(1)
            result["cosine_int8_vs_fp32"][shape] = {"min": float(cos.min()), "mean": float(cos.mean())}
            reference = torch_reference(model, pipelines["fp32"], shape_texts[:16])  # the FP32 graph is the model
            result["fp32_max_abs_vs_torch"][shape] = float(np.abs(vectors["fp32"][:16] - reference).max())
    print(json.dumps(result))


if __name__ == "__main__":
    main()
