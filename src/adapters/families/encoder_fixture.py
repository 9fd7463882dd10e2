"""Tiny random-weight encoder packages (R-PKG-3), deterministic by seed, in Hugging Face layout.

BERT variants: `embed` (BertModel + sentence-transformers mean pooling, normalized), `classify`
(BertForSequenceClassification, 3 labels, softmax), `multilabel` (the same with
`problem_type: multi_label_classification`, sigmoid), `rerank` (a cross-encoder, `num_labels: 1`),
`splade` (BertForMaskedLM + a sentence-transformers SparseEncoder: SpladePooling max / relu),
`colbert` (BertModel + CLS pooling, normalized, + a `colbert_linear` head of COLBERT_DIM: dense
and multi-vector outputs, rerank by MaxSim), `token` (BertForTokenClassification, BIO labels of
PER and LOC: `/v1/classify` with `kind: token`).
Other architectures: `<model_type>-<kind>` (`xlm-roberta-embed`, `modernbert-rerank`, `qwen3-rerank`
…, `ARCH_FIXTURES`): the architecture's module writes the config and the weights under
transformers' names, `models/fixture_tokenizers.py` a tokenizer of the model type's real kind
(SentencePiece Unigram, byte-level BPE or WordPiece) that transformers' own tokenizer class agrees
with. Decoder embedders pool the last token; decoder rerankers answer yes/no (srun.json `rerank`);
decoder classifiers (`qwen3-classify`, `qwen3-token` …) are written by `decoder_head_fixture.py`,
Qwen3.5's packages (`qwen3_5-embed`, `-rerank`, `-classify`, `-token`) by `qwen3_5_encoder_fixture.py`.
Weights come from numpy's PCG64 generator, so a seed writes the same bytes everywhere. Returns the
requests its golden file records.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vllm_srun.adapters.families.encoder_fixture_parts import (
    LABELS,
    LONG_TEXT,
    TOKEN_TEXTS,
    WORDS,
    golden_requests,
    pooling_files,
)
from vllm_srun.adapters.families.encoder_fixture_parts import write_json as _write_json
from vllm_srun.adapters.models.manifest import write_manifest

BERT_VARIANTS = ("embed", "classify", "multilabel", "rerank", "splade", "colbert", "token")
COLBERT_DIM = 16
# the other architectures: `<model_type>-<kind>` (module under adapters/models with fixture_config /
# fixture_weights, the kinds it writes)
ARCH_FIXTURES: dict[str, tuple[str, tuple[str, ...]]] = {
    "roberta": ("roberta_fixture", ("embed", "classify", "rerank")),
    "xlm-roberta": ("roberta_fixture", ("embed", "classify", "rerank")),
    "distilbert": ("distilbert", ("embed", "classify", "rerank")),
    "mpnet": ("mpnet", ("embed", "classify", "rerank")),
    "deberta-v2": ("deberta_v2_fixture", ("embed", "classify", "rerank")),
    "modernbert": ("modernbert", ("embed", "classify", "rerank")),
    "qwen3": ("decoder_encoder_fixture", ("embed", "rerank", "classify", "token")),
    "qwen2": ("decoder_encoder_fixture", ("embed", "rerank", "classify", "token")),
    "llama": ("decoder_encoder_fixture", ("embed", "rerank", "classify", "token")),
    "qwen3_5": ("qwen3_5_encoder", ("embed", "rerank", "classify", "token")),  # qwen3_5_encoder_fixture.py
}
# where each module ARCH_FIXTURES names lives, as dotted names (a moved module's name is rewritten
# with its imports; the modules are imported by name, when a package is written)
FIXTURE_MODULES = {
    "roberta_fixture": "vllm_srun.adapters.models.roberta_fixture",
    "distilbert": "vllm_srun.adapters.models.distilbert",
    "mpnet": "vllm_srun.adapters.models.mpnet",
    "deberta_v2_fixture": "vllm_srun.adapters.models.deberta_v2_fixture",
    "modernbert": "vllm_srun.adapters.models.modernbert",
    "decoder_encoder_fixture": "vllm_srun.adapters.models.decoder_encoder_fixture",
}
ARCH_VARIANTS = tuple(f"{arch}-{kind}" for arch, (_, kinds) in ARCH_FIXTURES.items() for kind in kinds)
VARIANTS = BERT_VARIANTS + ARCH_VARIANTS
HIDDEN, LAYERS, HEADS, INTERMEDIATE, POSITIONS = 32, 2, 4, 64, 128


def _tensors(vocab: int, num_labels: int | None, seed: int, head: str = "") -> dict[str, np.ndarray]:
    """BERT's tensors under transformers' names; HEAD `splade` adds a masked-LM head (BertForMaskedLM:
    `bert.` prefix, no pooler, decoder tied to the word embeddings), `colbert` a colbert_linear."""
    rng = np.random.default_rng(seed)

    def normal(*shape: int) -> np.ndarray:
        return (0.3 * rng.standard_normal(shape)).astype(np.float32)

    def norm(prefix: str) -> dict[str, np.ndarray]:
        return {
            f"{prefix}.weight": (1.0 + 0.2 * rng.standard_normal(HIDDEN)).astype(np.float32),
            f"{prefix}.bias": normal(HIDDEN),
        }

    base = "bert." if num_labels is not None or head == "splade" else ""
    out = {
        f"{base}embeddings.word_embeddings.weight": normal(vocab, HIDDEN),
        f"{base}embeddings.position_embeddings.weight": normal(POSITIONS, HIDDEN),
        f"{base}embeddings.token_type_embeddings.weight": normal(2, HIDDEN),
        **norm(f"{base}embeddings.LayerNorm"),
    }
    for i in range(LAYERS):
        p = f"{base}encoder.layer.{i}."
        for name, (rows, cols) in {
            "attention.self.query": (HIDDEN, HIDDEN),
            "attention.self.key": (HIDDEN, HIDDEN),
            "attention.self.value": (HIDDEN, HIDDEN),
            "attention.output.dense": (HIDDEN, HIDDEN),
            "intermediate.dense": (INTERMEDIATE, HIDDEN),
            "output.dense": (HIDDEN, INTERMEDIATE),
        }.items():
            out[f"{p}{name}.weight"] = normal(rows, cols)
            out[f"{p}{name}.bias"] = normal(rows)
        out.update(norm(f"{p}attention.output.LayerNorm"))
        out.update(norm(f"{p}output.LayerNorm"))
    out[f"{base}pooler.dense.weight"] = normal(HIDDEN, HIDDEN)
    out[f"{base}pooler.dense.bias"] = normal(HIDDEN)
    if num_labels is not None:
        out["classifier.weight"] = normal(num_labels, HIDDEN)
        out["classifier.bias"] = normal(num_labels)
    if head == "splade":
        del out["bert.pooler.dense.weight"], out["bert.pooler.dense.bias"]
        out["cls.predictions.transform.dense.weight"] = normal(HIDDEN, HIDDEN)
        out["cls.predictions.transform.dense.bias"] = normal(HIDDEN)
        out.update({k.replace("x.", "cls.predictions.transform.LayerNorm."): v for k, v in norm("x").items()})
        out["cls.predictions.bias"] = (normal(vocab) - 1.0).astype(np.float32)  # most words absent: sparse
    if head == "token":  # BertForTokenClassification: no pooler, a classifier over every token
        del out["bert.pooler.dense.weight"], out["bert.pooler.dense.bias"]
        # `_spread_token_head` rescales the classifier once the encoder is written
    if head == "colbert":
        out["colbert_linear.weight"] = normal(COLBERT_DIM, HIDDEN)
        out["colbert_linear.bias"] = normal(COLBERT_DIM)
    return out


def _spread_token_head(out: Path) -> None:
    """A tiny random encoder gives every token nearly the same last hidden state, so a random
    classifier labels them all alike. Rescale the token head over our own forward of a few texts:
    logits centred on the tokens' mean, spread about 2.5 apart, `O` favoured by one."""
    import torch
    from safetensors.numpy import load_file, save_file

    from vllm_srun.adapters.models.reference_encoder import ReferenceEncoder
    from vllm_srun.adapters.models.tokenization import TextTokenizer

    encoder = ReferenceEncoder.from_folder(out)
    rows = TextTokenizer.from_folder(out).encode([*TOKEN_TEXTS, LONG_TEXT])
    with torch.inference_mode():
        hidden = np.concatenate([encoder.encoder(*encoder.tensors([row]))[0].numpy() for row in rows]).astype(
            np.float64
        )
    path = out / "model.safetensors"
    tensors = load_file(str(path))
    weight = tensors["classifier.weight"].astype(np.float64)
    centred = (hidden - hidden.mean(axis=0)) @ weight.T
    weight *= 2.5 / max(float(centred.std()), 1e-6)
    bias = -(weight @ hidden.mean(axis=0))
    bias[0] += 1.0
    tensors["classifier.weight"], tensors["classifier.bias"] = weight.astype(np.float32), bias.astype(np.float32)
    save_file(tensors, str(path), metadata={"format": "pt"})


def _sentence_transformers_files(out: Path) -> None:
    _write_json(
        out / "modules.json",
        [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
        ],
    )
    _write_json(
        out / "1_Pooling" / "config.json",
        {
            "word_embedding_dimension": HIDDEN,
            "pooling_mode_cls_token": False,
            "pooling_mode_mean_tokens": True,
            "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False,
        },
    )
    (out / "2_Normalize").mkdir(exist_ok=True)
    _write_json(out / "sentence_bert_config.json", {"max_seq_length": POSITIONS, "do_lower_case": True})


def _sparse_files(out: Path, vocab: int) -> None:
    """A SparseEncoder's files as sentence-transformers writes them (masked-LM Transformer, SpladePooling)."""
    _write_json(
        out / "modules.json",
        [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.sparse_encoder.models.MLMTransformer"},
            {
                "idx": 1,
                "name": "1",
                "path": "1_SpladePooling",
                "type": "sentence_transformers.sparse_encoder.models.SpladePooling",
            },
        ],
    )
    _write_json(
        out / "1_SpladePooling" / "config.json",
        {"pooling_strategy": "max", "activation_function": "relu", "word_embedding_dimension": vocab},
    )
    _write_json(out / "sentence_bert_config.json", {"max_seq_length": POSITIONS, "do_lower_case": False})
    _write_json(
        out / "config_sentence_transformers.json",
        {"model_type": "SparseEncoder", "prompts": {"query": "", "document": ""}, "similarity_fn_name": "dot"},
    )


def _colbert_files(out: Path) -> None:
    """BGE-M3-style dense part: CLS pooling, normalized (the colbert_linear is in model.safetensors)."""
    pooling_files(out, HIDDEN, "cls_token", POSITIONS, True)


def split_variant(variant: str) -> tuple[str, str]:
    """`xlm-roberta-classify` → (`xlm-roberta`, `classify`); BERT's variants → (`bert`, variant)."""
    if variant in BERT_VARIANTS:
        return "bert", variant
    arch, _, kind = variant.rpartition("-")
    if arch not in ARCH_FIXTURES or kind not in ARCH_FIXTURES[arch][1]:
        raise ValueError(f"encoder fixtures come in variants {', '.join(VARIANTS)} (got {variant!r})")
    return arch, kind


DECODER_RERANK_POSITIONS = 1024
# architectures whose CPU forward runs in the C++ ops for head sizes of whole 512-bit vectors: the
# BERT-shaped ones whole in one call (`srun_cpu::encode`), MPNet and ModernBERT their attention
# (`varlen_attention_biased`: relative positions, sliding windows), DeBERTa its attention with both
# position terms (`varlen_attention_disentangled`). Their fixtures get 2 heads of 16
# (not 4 of 8, which keep SDPA), so the tests that serve them end to end cover those paths. (The
# decoders' fixtures keep 4 heads on 2 K/V heads: at 2 heads on 1, a tiny random Qwen2 reranker's
# int8 package drifts past the int8 test's 5 %.)
ONE_CALL_FIXTURES = ("roberta_fixture", "distilbert", "mpnet", "modernbert", "deberta_v2_fixture")
ONE_CALL_HEADS = 2


def write_arch_package(
    out: Path,
    arch: str,
    kind: str,
    seed: int,
    *,
    positions: int = POSITIONS,
    words: Sequence[str] = (),
    **sizes: int,
) -> list[dict[str, Any]]:
    """A random-weight package of ARCH (not BERT): its real tokenizer kind, its config as
    transformers writes it, random weights under transformers' names, sentence-transformers files
    for `embed`. SIZES (hidden, layers, heads, intermediate) default to the tiny fixture's; the
    benchmarks ask for MiniLM's (bench/architectures.py) and add their texts' WORDS to the
    vocabulary (each a token, as a real tokenizer's vocabulary holds common words)."""
    import importlib

    from safetensors.numpy import save_file

    from vllm_srun.adapters.models.fixture_tokenizers import write_fixture_tokenizer

    if arch == "qwen3_5":  # a hybrid backbone: its own writer (each kind in its publisher's layout)
        from vllm_srun.adapters.families.qwen3_5_encoder_fixture import write_qwen3_5_encoder_package

        return write_qwen3_5_encoder_package(out, kind, seed, positions=positions, words=words, **sizes)
    module = importlib.import_module(FIXTURE_MODULES[ARCH_FIXTURES[arch][0]])
    decoder = ARCH_FIXTURES[arch][0] == "decoder_encoder_fixture"
    if decoder and kind in ("classify", "token"):  # saved as transformers saves them, nothing of ours routes them
        from vllm_srun.adapters.families.decoder_head_fixture import write_decoder_head_package

        return write_decoder_head_package(out, arch, kind, seed, positions=positions, words=words, sizes=sizes)
    if ARCH_FIXTURES[arch][0] in ONE_CALL_FIXTURES:
        sizes = {"heads": ONE_CALL_HEADS, **sizes}
    if decoder and kind == "rerank":  # the Qwen3-Reranker template alone is about 210 of these tokens
        positions = max(positions, DECODER_RERANK_POSITIONS)
    vocabulary = [*WORDS, *words]
    info = write_fixture_tokenizer(
        out, arch, vocabulary, model_max_length=positions, add_eos=decoder and kind == "embed"
    )
    labels = {"classify": LABELS["classify"], "rerank": None if decoder else ["LABEL_0"]}.get(kind)
    extra = {"model_type": arch} if ARCH_FIXTURES[arch][0] in ("roberta_fixture", "decoder_encoder_fixture") else {}
    config = module.fixture_config(
        info.vocab_size, info.pad_token_id, len(labels) if labels else None, positions=positions, **sizes, **extra
    )
    if labels is not None:
        config.update(id2label={str(i): n for i, n in enumerate(labels)}, label2id={n: i for i, n in enumerate(labels)})
    _write_json(out / "config.json", config)
    weights = module.fixture_weights(config, len(labels) if labels else None, seed)
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    if kind == "embed":
        mode = "lasttoken" if decoder else ("cls_token" if arch == "modernbert" else "mean_tokens")
        pooling_files(out, int(config.get("hidden_size") or config.get("dim")), mode, positions, False)
    manifest: dict[str, Any] = {
        "family": "encoder",
        "surfaces": ["embeddings" if kind == "embed" else kind],
        "dtype": "float32",
        "max_input_tokens": positions,
        "fixture": {"variant": f"{arch}-{kind}", "seed": seed},
    }
    if decoder and kind == "rerank":
        manifest["rerank"] = {"yes": "yes", "no": "no"}
    if labels is not None and kind == "classify":
        manifest.update(labels=labels, multi_label=False)
    write_manifest(out, manifest)
    return golden_requests(kind, windows=not (decoder and kind == "rerank"))


def write_encoder_fixture(out: Path, variant: str | None, seed: int) -> list[dict[str, Any]]:
    from safetensors.numpy import save_file

    from vllm_srun.adapters.models.tokenization import write_tiny_wordpiece_tokenizer

    variant = variant or "embed"
    arch, kind = split_variant(variant)
    out = Path(out)
    if arch != "bert":
        return write_arch_package(out, arch, kind, seed)
    vocab = write_tiny_wordpiece_tokenizer(out, WORDS, model_max_length=POSITIONS)
    labels = LABELS.get(variant, ["LABEL_0"] if variant == "rerank" else None)
    architecture = "BertModel" if labels is None else "BertForSequenceClassification"
    if variant == "token":
        architecture = "BertForTokenClassification"
    config: dict[str, Any] = {
        "architectures": ["BertForMaskedLM" if variant == "splade" else architecture],
        "model_type": "bert",
        "vocab_size": len(vocab),
        "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "intermediate_size": INTERMEDIATE,
        "hidden_act": "gelu",
        "max_position_embeddings": POSITIONS,
        "type_vocab_size": 2,
        "layer_norm_eps": 1e-12,
        "pad_token_id": 0,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "torch_dtype": "float32",
    }
    if labels is not None:
        config.update(
            num_labels=len(labels),
            id2label={str(i): n for i, n in enumerate(labels)},
            label2id={n: i for i, n in enumerate(labels)},
        )
        if variant == "multilabel":
            config["problem_type"] = "multi_label_classification"
    _write_json(out / "config.json", config)
    save_file(
        _tensors(len(vocab), None if labels is None else len(labels), seed, variant),
        str(out / "model.safetensors"),
        metadata={"format": "pt"},
    )
    if variant == "token":
        _spread_token_head(out)
    surfaces = {
        "embed": ["embeddings"],
        "rerank": ["rerank"],
        "splade": ["embeddings"],
        "colbert": ["embeddings", "rerank"],
    }.get(variant, ["classify"])
    if variant == "embed":
        _sentence_transformers_files(out)
    elif variant == "splade":
        _sparse_files(out, len(vocab))
    elif variant == "colbert":
        _colbert_files(out)
    manifest: dict[str, Any] = {
        "family": "encoder",
        "surfaces": surfaces,
        "dtype": "float32",
        "max_input_tokens": POSITIONS,
        "fixture": {"variant": variant, "seed": seed},
    }
    if labels is not None and variant != "rerank":
        manifest.update(labels=labels, multi_label=variant == "multilabel")
    write_manifest(out, manifest)
    return golden_requests(variant)
