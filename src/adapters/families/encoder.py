"""The encoder family (R-PKG-2): BERT-style encoders serving embeddings (and, with a head,
classify / rerank). Rows are tokenized texts; one lane, counted as the engine's forwards are
(packed on the native engine, padded on ONNX Runtime). Weights live on the worker's device; on a
CPU merged forwards stay within 4,096 counted tokens, on a GPU within about 0.3 s of device time at
the lane's cost per token (R-BAT-7), which the GPU calibration measures first (R-DEV-2)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vllm_srun.adapters.contracts import (
    CalibrationForward,
    Family,
    LoadContext,
    LoadedModel,
    LogitsRow,
    PackageInfo,
    as_encoder_engine,
)
from vllm_srun.adapters.families.decoder_packages import is_decoder_encoder
from vllm_srun.adapters.families.encoder_fixture import VARIANTS, write_encoder_fixture
from vllm_srun.adapters.models.encoders import DECODER_TYPES, ENCODER_TYPES
from vllm_srun.adapters.models.manifest import asks_for_yes_no, read_manifest
from vllm_srun.adapters.models.tokenization import Encoded, TextTokenizer
from vllm_srun.domain.calibration import TIME_CAP_S
from vllm_srun.domain.dtypes import dtype_refusal, resolve_dtype
from vllm_srun.domain.lanes import Lane, forward_tokens
from vllm_srun.domain.rows import DEFAULT_LANE

# R-BAT-7: on a CPU a padded forward has a sweet spot; past it a forward is slower per row
# (bench/embeddings_load.py). Merged forwards of an encoder stay within this many padded tokens.
CPU_CAP_TOKENS = 4096
CALIBRATION_ROW_TOKENS = 512  # calibration forwards are rows of this many tokens (or the input limit)

SURFACES = frozenset({"embeddings", "classify", "rerank"})
GOLDEN_FILE = "golden.json"


def _head_labels(config: dict[str, Any], manifest: dict[str, Any] | None = None) -> int | None:
    """The classification head's label count from config.json; None for a bare encoder. A decoder
    yes/no reranker (srun.json `rerank`) has one: P(yes) against P(no)."""
    architectures = config.get("architectures") or []
    if not any(str(a).endswith("ForSequenceClassification") for a in architectures):
        decoder = str(config.get("model_type", "")).lower() in DECODER_TYPES
        return 1 if decoder and manifest and asks_for_yes_no(manifest) else None
    id2label = config.get("id2label") or {}
    return len(id2label) if id2label else int(config.get("num_labels", 2))


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


def _tokenizer(folder: Path, head: object) -> TextTokenizer:
    """The package's tokenizer; a yes/no reranker's renders each (query, document) pair into its
    prompt template (models/prompted_pairs.py)."""
    from vllm_srun.adapters.models.decoder_encoder import YesNoHead
    from vllm_srun.adapters.models.prompted_pairs import PromptedPairTokenizer

    if isinstance(head, YesNoHead):
        return PromptedPairTokenizer.from_folder(folder)
    return TextTokenizer.from_folder(folder)


class EncoderModel(LoadedModel):
    family = "encoder"

    def __init__(self, folder: Path, context: LoadContext) -> None:
        import torch

        from vllm_srun.adapters.models.reference_encoder import ReferenceEncoder
        from vllm_srun.adapters.models.st_modules import read_text_settings

        manifest = read_manifest(folder)
        device = context.device
        self.device = device
        self.dtype = resolve_dtype(context.args.dtype, "encoder", device.name, device.native_dtypes)
        refusal = dtype_refusal(context.args.dtype, device.name, device.native_dtypes)
        if refusal:
            raise ValueError(refusal)
        context.progress(f"load: reading weights of {folder.name} ({self.dtype}, {device.name})")
        self.reference = ReferenceEncoder.from_folder(
            folder, dtype=getattr(torch, self.dtype), device=device.torch_device
        )
        graph = folder / "model.onnx"
        self.forward = as_encoder_engine(
            context.build_engine(
                "encoder",
                self.reference,
                package_graph=graph if graph.is_file() else None,
                largest_forward_tokens=CPU_CAP_TOKENS,
            )
        )
        self.engine = self.forward
        self.tokenizer = _tokenizer(folder, self.reference.head)
        self.pooling = self.reference.pooling
        cfg = self.reference.config
        limit = min(self.pooling.max_seq_length or cfg.max_tokens, cfg.max_tokens)
        self.max_input_tokens = min(int(manifest.get("max_input_tokens") or limit), limit)
        self.normalized = self.pooling.normalize
        self.labels = list(self.reference.labels) if self.reference.has_classifier else []
        self.multi_label = bool(manifest.get("multi_label", cfg.problem_type == "multi_label_classification"))
        self.surfaces = _surfaces(manifest, cfg.num_labels if self.reference.has_classifier else None)
        cpu = device.kind == "cpu"
        self.lanes = (
            Lane(
                DEFAULT_LANE,
                self.forward.accounting,
                cap_tokens=CPU_CAP_TOKENS if cpu else None,
                cap_seconds=None if cpu else TIME_CAP_S,
            ),
        )
        golden = folder / GOLDEN_FILE
        self.golden_file = golden if golden.is_file() else None
        # sentence-transformers text settings (models/st_modules.py): prompts, lowercasing, similarity
        self.text_settings = read_text_settings(folder)
        self.prompts: dict[str, str] = dict(self.text_settings.prompts)
        self.default_prompt_name: str | None = self.text_settings.default_prompt_name
        self.dimensions = self.reference.dimensions

    def tokenize(self, texts: Sequence[str], *, truncate: bool) -> list[Encoded]:
        """Rows of TEXTS (a prompt, when the request asked for one, already prepended), lowercased
        first when the package's sentence_bert_config.json says do_lower_case."""
        prepared = self.text_settings.prepare(list(texts))
        return self.tokenizer.encode(prepared, max_length=self.max_input_tokens, truncate=truncate)

    def run(self, lane: str, payloads: Sequence[Any]) -> Sequence[Any]:
        heads = [i for i, p in enumerate(payloads) if isinstance(p, LogitsRow)]
        forward = self.forward
        if not heads:
            return list(forward.embed(payloads))
        if len(heads) == len(payloads):
            return list(forward.classify_logits([p.encoded for p in payloads]))
        out: list[Any] = [None] * len(payloads)  # rows of two surfaces in one forward: run each part
        pooled = sorted(set(range(len(payloads))) - set(heads))
        for idx, rows in (
            (heads, forward.classify_logits([payloads[i].encoded for i in heads])),
            (pooled, forward.embed([payloads[i] for i in pooled])),
        ):
            for i, row in zip(idx, rows):
                out[i] = row
        return out

    def probe_payloads(self) -> list[Any]:
        """Rows of mixed lengths (within 512 padded tokens together) for the batch-invariance probe."""
        words = [
            "the",
            "quick",
            "brown",
            "fox",
            "jumps",
            "over",
            "a",
            "lazy",
            "dog",
            "while",
            "seven",
            "small",
            "birds",
            "sing",
        ]
        lengths = [1, 4, 9, 17, 30, 52]
        texts = [" ".join(words[i % len(words)] for i in range(n)) for n in lengths]
        rows = self.tokenize(texts, truncate=True)
        rows = [r for r in rows if len(r.ids) <= 80] or rows[:1]
        if "embeddings" in self.surfaces:
            return rows
        return [LogitsRow(r) for r in rows]

    def calibration_forward(self, tokens: int) -> CalibrationForward:
        """Rows of the input limit's length (at most 512 tokens) adding up to about TOKENS (R-DEV-2)."""
        length = max(1, min(self.max_input_tokens, CALIBRATION_ROW_TOKENS))
        vocab = self.reference.config.vocab_size
        lengths = [length] * max(1, tokens // length)
        rest = tokens - sum(lengths)
        if rest >= 8:
            lengths.append(rest)
        rows = [
            Encoded([(997 * r + 31 * i + 101) % vocab for i in range(n)], [0] * n, False, n)
            for r, n in enumerate(lengths)
        ]
        payloads: list[Any] = rows if "embeddings" in self.surfaces else [LogitsRow(row) for row in rows]
        return CalibrationForward(DEFAULT_LANE, payloads, forward_tokens(lengths, self.lanes[0].accounting))

    def card_section(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.forward.describe())
        if "embeddings" in self.surfaces:
            out["embedding"] = {
                "dimensions": self.dimensions,
                "normalized": self.pooling.normalize,
                "pooling": self.pooling.mode,
                "after_pooling": self.pooling.describe(),
                "prompts": dict(self.prompts),
                "default_prompt_name": self.default_prompt_name,
                "similarity_fn_name": self.text_settings.similarity_fn_name or "cosine",
            }
        if "classify" in self.surfaces:
            out["classify"] = {"labels": self.labels, "multi_label": self.multi_label}
        if "rerank" in self.surfaces:
            from vllm_srun.adapters.models.prompted_pairs import PromptedPairTokenizer

            out["rerank"] = {"relevance": "sigmoid(logit)"}
            if isinstance(self.tokenizer, PromptedPairTokenizer):  # a yes/no reranker (its prompt template)
                prompt = self.tokenizer.prompt
                out["rerank"] = {
                    "relevance": "P(yes) / (P(yes) + P(no)) of the next token",
                    "yes": prompt.yes,
                    "no": prompt.no,
                }
        return out


class EncoderFamily(Family):
    name = "encoder"
    fixture_variants = VARIANTS

    def detect(self, folder: Path) -> bool:
        kind = str(read_config(folder).get("model_type", "")).lower()
        # decoder backbones only when the package is an embedder or a yes/no reranker (decoder_packages.py)
        return kind in ENCODER_TYPES or is_decoder_encoder(folder)

    def describe(self, folder: Path) -> PackageInfo:
        manifest = read_manifest(folder)
        declared = manifest.get("max_input_tokens")
        return PackageInfo(
            self.name,
            _surfaces(manifest, _head_labels(read_config(folder), manifest)),
            int(declared) if declared else None,
        )

    def load(self, folder: Path, context: LoadContext) -> LoadedModel:
        return EncoderModel(folder, context)

    def write_fixture(self, out: Path, variant: str | None, seed: int) -> list[dict[str, Any]]:
        return write_encoder_fixture(out, variant, seed)
