"""Tiny random RoBERTa / XLM-RoBERTa packages for `vllm-srun fixture` and the parity tests (no
`transformers` at run time); `bert.py` serves them.

`fixture_config(..., model_type="roberta" | "xlm-roberta")` is the config.json of a `RobertaModel` /
`XLMRobertaModel` (NUM_LABELS None) or the `…ForSequenceClassification`, as transformers 4.x writes it
(`torch_dtype`, `position_embedding_type`), dropout 0, one token type. `fixture_weights` gives
every tensor under transformers' names: the bare model's (with its pooler) or the classifier's
(`roberta.` prefix for both model types, no pooler, `classifier.dense` / `classifier.out_proj`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vllm_srun.adapters.models.bert import ROBERTA_TYPES, BertConfig
from vllm_srun.adapters.models.encoder_parts import FixtureSizes, FixtureTensors, label_fields

ARCHITECTURES = {"roberta": "Roberta", "xlm-roberta": "XLMRoberta", "camembert": "Camembert"}


def fixture_config(
    vocab_size: int,
    pad_token_id: int,
    num_labels: int | None,
    *,
    model_type: str = "roberta",
    **sizes: int,
) -> dict[str, Any]:
    """SIZES: `FixtureSizes`' fields. POSITIONS is the longest row: the position table has
    pad_token_id + 1 more rows (RoBERTa numbers positions from there), as roberta-base's 514 does for 512."""
    size = FixtureSizes(**sizes)
    if model_type not in ROBERTA_TYPES:
        raise ValueError(f"model_type {model_type!r} is not among {sorted(ROBERTA_TYPES)}")
    arch = ARCHITECTURES[model_type]
    config: dict[str, Any] = {
        "architectures": [f"{arch}Model" if num_labels is None else f"{arch}ForSequenceClassification"],
        "attention_probs_dropout_prob": 0.0,
        "bos_token_id": 0,
        "classifier_dropout": None,
        "eos_token_id": 2,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.0,
        "hidden_size": size.hidden,
        "initializer_range": 0.02,
        "intermediate_size": size.intermediate,
        "layer_norm_eps": 1e-05,
        "max_position_embeddings": size.positions + pad_token_id + 1,
        "model_type": model_type,
        "num_attention_heads": size.heads,
        "num_hidden_layers": size.layers,
        "pad_token_id": pad_token_id,
        "position_embedding_type": "absolute",
        "torch_dtype": "float32",
        "type_vocab_size": 1,
        "use_cache": True,
        "vocab_size": vocab_size,
    }
    return config | label_fields(num_labels)


def fixture_weights(config: dict[str, Any], num_labels: int | None, seed: int) -> dict[str, np.ndarray]:
    """Random float32 tensors (PCG64 from SEED) under transformers' names for CONFIG's model."""
    cfg = BertConfig.from_dict(config)
    t = FixtureTensors(seed)
    h, inner = cfg.hidden_size, cfg.intermediate_size
    base = "roberta." if num_labels is not None else ""
    out = {
        f"{base}embeddings.word_embeddings.weight": t.normal(cfg.vocab_size, h),
        f"{base}embeddings.position_embeddings.weight": t.normal(cfg.max_position_embeddings, h),
        f"{base}embeddings.token_type_embeddings.weight": t.normal(cfg.type_vocab_size, h),
        **t.norm(f"{base}embeddings.LayerNorm", h),
    }
    for i in range(cfg.num_hidden_layers):
        p = f"{base}encoder.layer.{i}."
        for n in ("query", "key", "value"):
            out.update(t.linear(f"{p}attention.self.{n}", h, h))
        out.update(t.linear(f"{p}attention.output.dense", h, h))
        out.update(t.norm(f"{p}attention.output.LayerNorm", h))
        out.update(t.linear(f"{p}intermediate.dense", inner, h))
        out.update(t.linear(f"{p}output.dense", h, inner))
        out.update(t.norm(f"{p}output.LayerNorm", h))
    if num_labels is None:
        out.update(t.linear("pooler.dense", h, h))
    else:
        out.update(t.linear("classifier.dense", h, h))
        out.update(t.linear("classifier.out_proj", num_labels, h))
    return out
