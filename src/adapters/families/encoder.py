"""The encoder family (R-PKG-2): BERT-style encoders serving embeddings (and, with a head,
classify / rerank). Rows are tokenized texts; one lane, padded accounting."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from vllm_srun.adapters.families.base import EncoderForward, Family, LoadedModel, LoadOptions, Progress
from vllm_srun.adapters.families.manifest import read_manifest
from vllm_srun.domain.dtypes import auto_dtype, resolve_dtype
from vllm_srun.domain.lanes import Accounting, Lane
from vllm_srun.domain.planning import BATCH_INVARIANT_TOKENS
from vllm_srun.domain.rows import DEFAULT_LANE

ENCODER_MODEL_TYPES = frozenset({"bert"})

# R-BAT-7: on a CPU a padded forward has a sweet spot; past it a forward is slower per row
# (bench/embeddings_load.py). Merged forwards of an encoder stay within this many padded tokens.
CPU_CAP_TOKENS = 4096

SURFACES = frozenset({"embeddings", "classify", "rerank"})


@dataclass(frozen=True, slots=True)
class LogitsRow:
    """A row answered by the classification head (classify, rerank), not by pooling."""

    encoded: Any


def _surfaces(manifest: dict[str, Any], num_labels: int | None) -> frozenset[str]:
    """What the package can serve: the manifest's list, checked against the head (if any)."""
    can = {"embeddings"}
    if num_labels is not None:
        can.add("rerank" if num_labels == 1 else "classify")
    default = {"embeddings"} if num_labels is None else can - {"embeddings"}
    wanted = set(manifest.get("surfaces") or default)
    unknown, missing = wanted - SURFACES, wanted - can
    if unknown or missing:
        raise ValueError(f"srun.json lists surfaces this package cannot serve: {sorted(unknown | missing)}")
    return frozenset(wanted)


def read_config(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    if not path.exists():
        return {}
    return json.loads(path.read_text())


class EncoderModel(LoadedModel):
    family = "encoder"

    def __init__(self, folder: Path, options: LoadOptions, progress: Progress) -> None:
        import torch

        from vllm_srun.adapters.models.reference_encoder import ReferenceEncoder
        from vllm_srun.adapters.models.tokenization import TextTokenizer

        self.folder = folder
        manifest = read_manifest(folder)
        self.dtype = resolve_dtype(options.args.dtype, "encoder", options.device)
        if self.dtype == "float16" and options.device.split(":")[0] not in ("cuda", "rocm"):
            raise ValueError(f"dtype float16 runs on GPUs only (device {options.device})")
        if options.engine == "onnxruntime" and self.dtype != auto_dtype("encoder", options.device):
            raise ValueError(f"the onnxruntime engine runs only dtype auto (asked: {options.args.dtype})")
        progress(f"load: reading weights from {folder} ({self.dtype})")
        self.runner = ReferenceEncoder.from_folder(folder, dtype=getattr(torch, self.dtype))
        # the engine's forward (native torch, + oneDNN fast path where measured; or ONNX Runtime)
        self.forward: EncoderForward = self.runner  # type: ignore[assignment]
        if options.engines is not None:
            onnx_file = folder / "model.onnx"
            self.forward = options.engines.encoder(
                self.runner, options, progress, onnx_file=onnx_file if onnx_file.is_file() else None,
                largest_forward_tokens=CPU_CAP_TOKENS)
        elif options.engine == "onnxruntime":
            raise ValueError("the onnxruntime engine was asked for, but no engine factory was given")
        self.tokenizer = TextTokenizer.from_folder(folder)
        self.pooling = self.runner.pooling
        cfg = self.runner.config
        limit = min(self.pooling.max_seq_length or cfg.max_tokens, cfg.max_tokens)
        self.max_input_tokens = min(int(manifest.get("max_input_tokens") or limit), limit)
        self.dimensions = self.runner.dimensions
        self.device = options.device
        self.engine = getattr(self.forward, "engine", "native")
        self.batch_invariant = False
        self.labels = list(self.runner.labels) if self.runner.has_classifier else []
        self.multi_label = bool(manifest.get("multi_label", cfg.problem_type == "multi_label_classification"))
        self.surfaces = _surfaces(manifest, cfg.num_labels if self.runner.has_classifier else None)
        cap = CPU_CAP_TOKENS if options.device == "cpu" else None
        # the native engine lays rows back to back (packed); ONNX Runtime runs padded batches
        accounting = getattr(self.forward, "accounting", Accounting.PADDED)
        self.lanes = (Lane(DEFAULT_LANE, accounting, cap_tokens=cap),)

    def tokenize(self, texts: Sequence[str], *, truncate: bool) -> list[Any]:
        return self.tokenizer.encode(list(texts), max_length=self.max_input_tokens, truncate=truncate)

    def tokenize_pairs(self, pairs: Sequence[tuple[str, str]], *, truncate: bool) -> list[Any]:
        return self.tokenizer.encode_pairs(list(pairs), max_length=self.max_input_tokens, truncate=truncate)

    def run(self, lane: str, payloads: Sequence[Any]) -> Sequence[Any]:
        heads = [i for i, p in enumerate(payloads) if isinstance(p, LogitsRow)]
        forward = self.forward
        if not heads:
            return list(forward.embed(payloads))
        if len(heads) == len(payloads):
            return list(forward.classify_logits([p.encoded for p in payloads]))
        out: list[Any] = [None] * len(payloads)  # rows of two surfaces in one forward: run each part
        pooled = sorted(set(range(len(payloads))) - set(heads))
        for idx, rows in ((heads, forward.classify_logits([payloads[i].encoded for i in heads])),
                          (pooled, forward.embed([payloads[i] for i in pooled]))):
            for i, row in zip(idx, rows):
                out[i] = row
        return out

    @property
    def known_batch_variant(self) -> bool:
        """The forward changes kernels below 512 padded tokens (the oneDNN fast path measured not
        slower only for smaller forwards): the probe's small batches could not show what merged
        forwards of up to 512 tokens do, so the model is `approximate` without probing."""
        switch = getattr(self.forward, "kernel_switch_tokens", None)
        return switch is not None and switch < BATCH_INVARIANT_TOKENS

    def probe_payloads(self) -> list[Any]:
        """Rows of mixed lengths (within 512 padded tokens together) for the batch-invariance probe."""
        words = "the quick brown fox jumps over a lazy dog while seven small birds sing".split()
        lengths = [1, 4, 9, 17, 30, 52]
        texts = [" ".join(words[i % len(words)] for i in range(n)) for n in lengths]
        rows = self.tokenize(texts, truncate=True)
        rows = [r for r in rows if len(r.ids) <= 80] or rows[:1]
        if "embeddings" in self.surfaces:
            return rows
        return [LogitsRow(r) for r in rows]

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.forward.describe()) if hasattr(self.forward, "describe") else {}
        if "embeddings" in self.surfaces:
            out["embedding"] = {
                "dimensions": self.dimensions,
                "normalized": self.pooling.normalize,
                "pooling": self.pooling.mode,
            }
        if "classify" in self.surfaces:
            out["classify"] = {"labels": self.labels, "multi_label": self.multi_label}
        if "rerank" in self.surfaces:
            out["rerank"] = {"relevance": "sigmoid(logit)"}
        return out


class EncoderFamily(Family):
    name = "encoder"

    def detect(self, folder: Path) -> bool:
        return read_config(folder).get("model_type") in ENCODER_MODEL_TYPES

    def load(self, folder: Path, options: LoadOptions, progress: Progress) -> LoadedModel:
        return EncoderModel(folder, options, progress)
