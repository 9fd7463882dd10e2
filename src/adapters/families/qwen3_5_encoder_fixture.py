"""Tiny random Qwen3.5 packages of the encoder family (`vllm-srun fixture --family encoder
--variant qwen3_5-KIND`, R-PKG-3), each in the layout its publisher's tool saves, beside Qwen3.5's
byte-level BPE tokenizer (`models/fixture_tokenizers.py`, kind `qwen3_5`). The text model's config
and weights are the decision fixture's (`qwen3_5_fixture.py`: 4 layers, three Gated DeltaNet and
one gated full attention).

- `embed`: a sentence-transformers package over a bare `Qwen3_5TextModel` (weights without a
  prefix), last-token pooling then Normalize, the tokenizer closing every text with
  `<|endoftext|>` (as Qwen3-Embedding's does), and `query` / `document` prompts;
- `rerank`: a `Qwen3_5ForCausalLM` (untied `lm_head`) with srun.json's `rerank` section: the
  Qwen3-Reranker recipe, P(yes) against P(no) of the next token;
- `classify`: `Qwen3_5TextForSequenceClassification` (text-only layout, `model.*` + `score`), three
  labels, the tokenizer closing every text with the pad token (read before it, as transformers reads);
- `token`: `Qwen3_5ForTokenClassification`, the multimodal layout transformers defines it for
  (`model_type: qwen3_5`, the text model under `text_config` and `model.language_model.*`, a
  one-block vision tower that is not read), BIO labels of PER and LOC, its `score` layer spread
  over our own forward (`decoder_head_fixture.spread_score_head`).
Only `rerank` has a srun.json saying anything (its recipe); the others' records provenance alone.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vllm_srun.adapters.families.encoder_fixture_parts import LABELS, WORDS, golden_requests, pooling_files
from vllm_srun.adapters.models.manifest import write_manifest

KINDS = ("embed", "rerank", "classify", "token")
RERANK_POSITIONS = 1024  # the Qwen3-Reranker template alone is about 210 of the fixture's tokens
PROMPTS = {"query": "Instruct: Given a query, retrieve relevant passages\nQuery: ", "document": ""}


def write_qwen3_5_encoder_package(
    out: Path, kind: str, seed: int, *, positions: int, words: Sequence[str] = (), **sizes: int
) -> list[dict[str, Any]]:
    """A random Qwen3.5 package of KIND in OUT (module doc); the requests its golden file records."""
    from safetensors.numpy import save_file

    from vllm_srun.adapters.families.decoder_head_fixture import spread_score_head
    from vllm_srun.adapters.families.qwen3_5_fixture import rng_matrix, text_config, text_tensors
    from vllm_srun.adapters.models.fixture_tokenizers import write_fixture_tokenizer

    if kind not in KINDS:
        raise ValueError(f"Qwen3.5 encoder fixtures come in kinds {', '.join(KINDS)} (got {kind!r})")
    out = Path(out)
    if kind == "rerank":
        positions = max(positions, RERANK_POSITIONS)
    info = write_fixture_tokenizer(
        out, "qwen3_5", [*WORDS, *words], model_max_length=positions, add_eos=kind in ("embed", "classify")
    )
    text = text_config(info.vocab_size, positions, **sizes)
    text.update(eos_token_id=info.eos_token_id, dtype="float32")
    labels = LABELS.get(kind, [])
    named = {"id2label": {str(i): n for i, n in enumerate(labels)}, "label2id": {n: i for i, n in enumerate(labels)}}
    manifest: dict[str, Any] = {"fixture": {"variant": f"qwen3_5-{kind}", "seed": seed}}
    if kind == "embed":
        config: dict[str, Any] = {"architectures": ["Qwen3_5TextModel"], **text}
        tensors = text_tensors(text, seed, prefix="")
        pooling_files(out, text["hidden_size"], "lasttoken", positions, False)
        _write_json(
            out / "config_sentence_transformers.json",
            {"prompts": PROMPTS, "default_prompt_name": None, "similarity_fn_name": "cosine"},
        )
    elif kind == "rerank":
        config = {"architectures": ["Qwen3_5ForCausalLM"], **text}
        tensors = text_tensors(text, seed)
        tensors["lm_head.weight"] = rng_matrix(seed, info.vocab_size, text["hidden_size"])
        manifest["rerank"] = {"yes": "yes", "no": "no"}
    elif kind == "classify":
        text["pad_token_id"] = info.pad_token_id
        config = {"architectures": ["Qwen3_5TextForSequenceClassification"], **text, **named}
        tensors = text_tensors(text, seed)
        tensors["score.weight"] = rng_matrix(seed + 3, len(labels), text["hidden_size"])
    else:
        text.update(pad_token_id=info.pad_token_id, tie_word_embeddings=True)
        text.pop("dtype")
        config = _multimodal(text, info.vocab_size, "Qwen3_5ForTokenClassification") | named
        tensors = text_tensors(text, seed, prefix="model.language_model.")
        tensors.update(_vision_tensors(text["hidden_size"], seed))
        tensors["score.weight"] = rng_matrix(seed + 3, len(labels), text["hidden_size"])
        tensors["score.bias"] = np.zeros(len(labels), dtype=np.float32)
    _write_json(out / "config.json", dict(sorted(config.items())))
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    if kind == "token":
        spread_score_head(out)
    write_manifest(out, manifest)
    return golden_requests(kind, windows=kind != "rerank")


def _multimodal(text: dict[str, Any], vocab: int, architecture: str) -> dict[str, Any]:
    """config.json of the multimodal layout around TEXT (as `qwen3_5_fixture.py` writes it)."""
    from vllm_srun.adapters.families.qwen3_5_fixture import VISION

    return {
        "architectures": [architecture],
        "model_type": "qwen3_5",
        "text_config": text,
        "vision_config": {**VISION, "out_hidden_size": text["hidden_size"]},
        "tie_word_embeddings": bool(text["tie_word_embeddings"]),
        "image_token_id": vocab,  # past the vocabulary: no text token is taken for an image
        "video_token_id": vocab + 1,
        "vision_start_token_id": vocab + 2,
        "vision_end_token_id": vocab + 3,
        "dtype": "float32",
    }


def _vision_tensors(out_hidden: int, seed: int) -> dict[str, np.ndarray]:
    from vllm_srun.adapters.families import qwen3_5_fixture

    return qwen3_5_fixture._vision_tensors(out_hidden, seed)


def _write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")
