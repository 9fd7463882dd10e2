"""The encoder family (R-PKG-2): BERT-style encoders serving embeddings (and, with a head,
classify / rerank; sparse and multi-vector outputs and MaxSim rerank: `encoder_outputs.py`). Rows are tokenized texts; one lane, counted as the engine's forwards are
(packed on the native engine, padded on ONNX Runtime); a planned forward is one engine call over one
`Batch` (`contracts/batch.py`: each row asks a pooled embedding, head logits or its token states). Weights live on the worker's device; on a
CPU merged forwards stay within 4,096 counted tokens, on a GPU within about 0.3 s of device time at
the lane's cost per token (R-BAT-7), which the GPU calibration measures first (R-DEV-2)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vllm_srun.adapters.contracts import (
    Ask,
    Batch,
    CalibrationForward,
    Family,
    LoadContext,
    LoadedModel,
    LogitsRow,
    PackageInfo,
    as_encoder_engine,
)
from vllm_srun.adapters.contracts.outputs import OUTPUT_KINDS, TokenOutputRow
from vllm_srun.adapters.contracts.token_heads import TokenLogitsRow
from vllm_srun.adapters.families.decoder_packages import is_decoder_encoder
from vllm_srun.adapters.families.encoder_outputs import TokenOutputs, has_colbert_head, read_ranges
from vllm_srun.adapters.families.fixtures.encoder_fixture import VARIANTS, write_encoder_fixture
from vllm_srun.adapters.models.encoders import DECODER_TYPES, ENCODER_TYPES
from vllm_srun.adapters.models.manifest import asks_for_yes_no, read_manifest
from vllm_srun.adapters.models.token_classifier import TOKEN_ARCHITECTURE_SUFFIX, is_token_classifier
from vllm_srun.adapters.models.tokenization import Encoded, TextTokenizer
from vllm_srun.domain.scheduling.lanes import Lane, forward_tokens
from vllm_srun.domain.scheduling.rows import DEFAULT_LANE
from vllm_srun.domain.settings.dtypes import dtype_refusal, resolve_dtype
from vllm_srun.domain.worker.calibration import TIME_CAP_S

# R-BAT-7: on a CPU a padded forward has a sweet spot; past it a forward is slower per row
# (bench/embeddings_load.py). Merged forwards of an encoder stay within this many padded tokens.
CPU_CAP_TOKENS = 4096
CALIBRATION_ROW_TOKENS = 512  # calibration forwards are rows of this many tokens (or the input limit)
CLASSIFY_THRESHOLD = 0.5  # a multi-label head's selection threshold when a request sets none

SURFACES = frozenset({"embeddings", "classify", "rerank"})
GOLDEN_FILE = "golden.json"


def _head_labels(config: dict[str, Any], manifest: dict[str, Any] | None = None) -> int | None:
    """The classification head's label count from config.json; None for a bare encoder. A decoder
    yes/no reranker (srun.json `rerank`) has one: P(yes) against P(no)."""
    architectures = config.get("architectures") or []
    heads = ("ForSequenceClassification", TOKEN_ARCHITECTURE_SUFFIX)  # a token head serves classify too
    if not any(str(a).endswith(heads) for a in architectures):
        decoder = str(config.get("model_type", "")).lower() in DECODER_TYPES
        return 1 if decoder and manifest and asks_for_yes_no(manifest) else None
    id2label = config.get("id2label") or {}
    return len(id2label) if id2label else int(config.get("num_labels", 2))


def _surfaces(
    manifest: dict[str, Any], num_labels: int | None, maxsim: str = "", token: bool = False
) -> frozenset[str]:
    """What the package can serve: the manifest's list, checked against the head (if any). An
    encoder without a head can rerank by MaxSim (MAXSIM `can`), by default when it has a ColBERT
    head (MAXSIM `default`). A token head (TOKEN) serves classify whatever its label count."""
    can = {"embeddings"}
    if num_labels is not None:
        can.add("rerank" if num_labels == 1 and not token else "classify")
    elif maxsim:
        can.add("rerank")
    default = {"embeddings"} if num_labels is None else can - {"embeddings"}
    if num_labels is None and maxsim == "default":
        default.add("rerank")
    wanted = set(manifest.get("surfaces") or default)
    unknown, missing = wanted - SURFACES, wanted - can
    if unknown or missing:
        raise ValueError(f"srun.json lists surfaces this package cannot serve: {sorted(unknown | missing)}")
    return frozenset(wanted)


def _maxsim(folder: Path, num_labels: int | None) -> str:
    """Whether an encoder without a head may rerank by MaxSim: `default` (a ColBERT head), `can`, or ''."""
    if num_labels is not None or str(read_config(folder).get("model_type", "")).lower() not in ENCODER_TYPES:
        return ""
    return "default" if has_colbert_head(folder) else "can"


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


def _token_head(folder: Path, cfg: Any) -> Any:
    """The token-classification head of a `*ForTokenClassification` package, else None (a decoder's
    is its `score` layer: models/decoder_heads.py)."""
    config = read_config(folder)
    if not is_token_classifier(config):
        return None
    if cfg.model_type in DECODER_TYPES:
        from vllm_srun.adapters.models.decoder_heads import read_score_token_head

        return read_score_token_head(folder, cfg.hidden_size, cfg.num_labels, config)
    from vllm_srun.adapters.models.token_classifier import read_token_head

    return read_token_head(folder, cfg.hidden_size, cfg.num_labels)


class EncoderModel(LoadedModel):
    family = "encoder"

    def __init__(self, folder: Path, context: LoadContext) -> None:
        import torch

        from vllm_srun.adapters.models.decoder_heads import head_rows
        from vllm_srun.adapters.models.reference_encoder import ReferenceEncoder
        from vllm_srun.adapters.models.st_modules import SPARSE_ARCHETYPE, read_package, read_text_settings

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
        self.encoder_engine = as_encoder_engine(
            context.build_engine(
                "encoder",
                self.reference,
                package_graph=graph if graph.is_file() else None,
                largest_forward_tokens=CPU_CAP_TOKENS,
            )
        )
        self.engine = self.encoder_engine
        self.tokenizer = _tokenizer(folder, self.reference.head)
        self.pooling = self.reference.pooling
        cfg = self.reference.config
        limit = min(self.pooling.max_seq_length or cfg.max_tokens, cfg.max_tokens)
        self.max_input_tokens = min(int(manifest.get("max_input_tokens") or limit), limit)
        self.normalized = self.pooling.normalize
        # a `*ForTokenClassification` package labels every token (models/token_classifier.py)
        self.token_head = _token_head(folder, cfg) if not self.reference.has_classifier else None
        self.head_rows = head_rows(self.reference.head)  # a decoder's score head: where transformers reads
        self.classify_kind = "token" if self.token_head is not None else "sequence"
        heads = self.reference.has_classifier or self.token_head is not None
        self.labels = list(self.reference.labels) if heads else []
        token = self.token_head is not None
        self.multi_label = not token and bool(
            manifest.get("multi_label", cfg.problem_type == "multi_label_classification")
        )
        num_labels = cfg.num_labels if heads else None
        self.surfaces = _surfaces(manifest, num_labels, _maxsim(folder, num_labels), token)
        cpu = device.kind == "cpu"
        self.lanes = (
            Lane(
                DEFAULT_LANE,
                self.encoder_engine.accounting,
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
        # outputs beyond the dense vector (encoder_outputs.py)
        sparse = self.text_settings.model_type == SPARSE_ARCHETYPE
        splade = read_package(folder).splade if sparse else None
        encoder_type = str(read_config(folder).get("model_type", "")).lower() in ENCODER_TYPES
        self.token_outputs = TokenOutputs(folder, self.reference, self.tokenizer, splade, encoder_type)
        self.output_kinds = self.token_outputs.kinds | (frozenset() if sparse else frozenset({"dense"}))
        self.multi_vector_dimensions = self.token_outputs.multi_vector_dimensions
        self.rerank_scoring = "maxsim" if "rerank" in self.surfaces and num_labels is None else "head"
        self.embedding_ranges = read_ranges(folder, self.dimensions) if not sparse else None

    def tokenize(self, texts: Sequence[str], *, truncate: bool, max_length: int | None = None) -> list[Encoded]:
        """Rows of TEXTS (a prompt, when the request asked for one, already prepended), lowercased
        first when the package's sentence_bert_config.json says do_lower_case."""
        prepared = self.text_settings.fold_case(list(texts))
        limit = min(max_length or self.max_input_tokens, self.max_input_tokens)
        return self.tokenizer.encode(prepared, max_length=limit, truncate=truncate)

    def run(self, lane: str, payloads: Sequence[Any]) -> Sequence[Any]:
        """One planned forward: its rows as one `Batch` (`batch_of`), one engine call, then the
        token heads on the rows that asked for token states (`finish`)."""
        return self.finish(payloads, self.encoder_engine.forward(self.batch_of(payloads)))

    def batch_of(self, payloads: Sequence[Any]) -> Batch:
        """What each row asks: a token head's model, a sparse or multi-vector row → its token
        states; a `LogitsRow` → the head's logits (a decoder score head's row cut where it reads,
        `head_rows`); any other row (an `Encoded`) → the pooled embedding."""
        if self.token_head is not None:  # every row of a token head's model: its token states
            return Batch.of([p.encoded for p in payloads], Ask.TOKENS)
        rows: list[Encoded] = []
        asks: list[Ask] = []
        heads: list[int] = []
        for i, p in enumerate(payloads):
            if isinstance(p, TokenOutputRow):
                rows.append(p.encoded)
                asks.append(Ask.TOKENS)
            elif isinstance(p, LogitsRow):
                heads.append(i)
                rows.append(p.encoded)
                asks.append(Ask.LOGITS)
            else:
                rows.append(p)
                asks.append(Ask.EMBEDDING)
        for i, cut in zip(heads, self.head_rows([rows[i] for i in heads]) if heads else ()):
            rows[i] = cut
        return Batch(tuple(rows), tuple(asks))

    def finish(self, payloads: Sequence[Any], outputs: Sequence[Any]) -> list[Any]:
        """OUTPUTS (one per row) as the rows' answers: token states through the token head (logits
        [tokens, labels]) or the row's sparse / multi-vector head; the rest as the engine gave them."""
        if self.token_head is not None:
            from vllm_srun.adapters.models.token_classifier import head_logits

            return head_logits(self.token_head, outputs)
        out = list(outputs)
        tokens = [i for i, p in enumerate(payloads) if isinstance(p, TokenOutputRow)]
        if tokens:
            finished = self.token_outputs.finish([payloads[i] for i in tokens], [out[i] for i in tokens])
            for i, row in zip(tokens, finished):
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
        return [TokenLogitsRow(r) if self.token_head is not None else LogitsRow(r) for r in rows]

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
        row_type = TokenLogitsRow if self.token_head is not None else LogitsRow
        payloads: list[Any] = rows if "embeddings" in self.surfaces else [row_type(row) for row in rows]
        return CalibrationForward(DEFAULT_LANE, payloads, forward_tokens(lengths, self.lanes[0].accounting))

    def card_section(self) -> dict[str, Any]:
        """The card's `embedding`, `heads` and `rerank` sections: the contract's fields first
        (docs/contract.md), then ours."""
        out: dict[str, Any] = dict(self.encoder_engine.describe())
        layers = self.reference.config.num_hidden_layers  # every output comes from the last layer
        if "embeddings" in self.surfaces:
            dense = "dense" in self.output_kinds
            embedding: dict[str, Any] = {
                # the dense vector's size (any smaller `dimensions` cuts it); none for a sparse-only model
                "dimensions": [self.dimensions] if dense else [],
                "layers": [layers],
                "modalities": ["text"],
                "normalized": bool(self.pooling.normalize) if dense else False,
                "pooling": self.pooling.mode if dense else "sparse",
                "input_types": ["query", "document"] if self.prompts else [],  # they pick a prompt
                "outputs": [k for k in OUTPUT_KINDS if k in self.output_kinds],
            }
            if dense:
                embedding.update(after_pooling=self.pooling.describe())
            embedding.update(
                prompts=dict(self.prompts),
                default_prompt_name=self.default_prompt_name,
                similarity_fn_name=self.text_settings.similarity_fn_name or ("cosine" if dense else "dot"),
                **self.token_outputs.card(),
            )
            if dense:
                embedding["encodings"] = {
                    "formats": ["float", "base64", "int8", "uint8", "binary", "ubinary"],
                    "int8_ranges": "package (embedding_ranges.json)"
                    if self.embedding_ranges is not None
                    else "fixed [-1, 1]"
                    if self.normalized
                    else None,
                }
            out["embedding"] = embedding
        if "classify" in self.surfaces:
            out["classify"] = {"labels": self.labels, "multi_label": self.multi_label}
            out["heads"] = [self._head_card()]
        if "rerank" in self.surfaces:
            from vllm_srun.adapters.models.prompted_pairs import PromptedPairTokenizer

            width = self.multi_vector_dimensions if self.rerank_scoring == "maxsim" else None
            exit_ = {"layer": layers, "dimension": width or self.reference.config.hidden_size}
            rerank: dict[str, Any] = {"exits": [exit_], "default": dict(exit_), "relevance": "sigmoid(logit)"}
            if self.rerank_scoring == "maxsim":
                rerank["relevance"] = (
                    "maxsim: the sum over query tokens of their best dot product with a document token"
                )
            if isinstance(self.tokenizer, PromptedPairTokenizer):  # a yes/no reranker (its prompt template)
                prompt = self.tokenizer.prompt
                rerank.update(relevance="P(yes) / (P(yes) + P(no)) of the next token", yes=prompt.yes, no=prompt.no)
            out["rerank"] = rerank
        return out

    def _head_card(self) -> dict[str, Any]:
        """The one classify head (`classify`): `sequence` (softmax over the labels), `scores`
        (multi-label: an independent sigmoid score per label, `selected` at one threshold) or
        `token` (a label per token, spans). No package carries a per-label operating point."""
        token = self.token_head is not None
        kind = "token" if token else "scores" if self.multi_label else "sequence"
        head: dict[str, Any] = {
            "name": "classify",
            "kind": kind,
            "labels": self.labels,
            "inputs": ["text"] if token else ["text", "pair"],
            "default_threshold": CLASSIFY_THRESHOLD if kind == "scores" else None,
            "thresholds": None,
            "overflow": "reject",  # the serving card puts the deployment's input.overflow here
            "window": None,
            "reduction": "span_union" if token else "max",  # how the windows of one input are joined
            "operating_point_sha256": None,
        }
        if token:
            head.update(aggregation=["simple", "first", "none"], default_aggregation="simple")
        return head


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
            _surfaces(
                manifest,
                labels := _head_labels(config := read_config(folder), manifest),
                _maxsim(folder, labels),
                is_token_classifier(config),
            ),
            int(declared) if declared else None,
        )

    def load(self, folder: Path, context: LoadContext) -> LoadedModel:
        return EncoderModel(folder, context)

    def write_fixture(self, out: Path, variant: str | None, seed: int) -> list[dict[str, Any]]:
        return write_encoder_fixture(out, variant, seed)
