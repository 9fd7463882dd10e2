"""Tiny random DeBERTa-v2 packages (`vllm-srun fixture`, the parity tests): config.json as
transformers writes it (`STYLES`: v3 — no absolute positions, shared position keys, log buckets —
or v2) and tensors under transformers' names, from numpy's generator (no transformers at run time)."""

from __future__ import annotations

from typing import Any

import numpy as np

from vllm_srun.adapters.models.deberta_v2_config import MODEL_TYPE, DebertaV2Config
from vllm_srun.adapters.models.encoder_parts import FixtureSizes, FixtureTensors, label_fields

STYLES = ("v3", "v2")


def fixture_config(
    vocab_size: int,
    pad_token_id: int,
    num_labels: int | None,
    *,
    style: str = "v3",
    bos_token_id: int = 1,
    eos_token_id: int = 2,
    **options: Any,
) -> dict[str, Any]:
    """config.json as transformers 4.x writes it for `DebertaV2Model` / `DebertaV2ForSequenceClassification`.
    STYLE "v3" (DeBERTa-v3 / mDeBERTa: no absolute positions, shared position keys, log buckets, normed
    relative embeddings; `position_buckets` 32 here so tiny rows reach the buckets) or "v2" (absolute
    positions, own position projections, plain relative positions, "c2p|p2c" as old configs write it).
    BOS / EOS default to DeBERTa-v3's [CLS] / [SEP] ids. OPTIONS: `FixtureSizes`' fields, and config
    fields to replace or add."""
    size, overrides = FixtureSizes.pick(options)
    if style not in STYLES:
        raise ValueError(f"style {style!r} is not one of {STYLES}")
    arch = "DebertaV2Model" if num_labels is None else "DebertaV2ForSequenceClassification"
    config: dict[str, Any] = {
        "architectures": [arch],
        "attention_probs_dropout_prob": 0.0,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.0,
        "hidden_size": size.hidden,
        "initializer_range": 0.02,
        "intermediate_size": size.intermediate,
        "layer_norm_eps": 1e-7,
        "legacy": True,
        "max_position_embeddings": size.positions,
        "max_relative_positions": -1,
        "model_type": MODEL_TYPE,
        "num_attention_heads": size.heads,
        "num_hidden_layers": size.layers,
        "pad_token_id": pad_token_id,
        "pooler_dropout": 0,
        "pooler_hidden_act": "gelu",
        "pooler_hidden_size": size.hidden,
        "relative_attention": True,
        "torch_dtype": "float32",
        "type_vocab_size": 0,
        "vocab_size": vocab_size,
    }
    if style == "v3":
        config.update(
            norm_rel_ebd="layer_norm",
            pos_att_type=["p2c", "c2p"],
            position_biased_input=False,
            position_buckets=32,
            share_att_key=True,
        )
    else:
        config.update(pos_att_type="c2p|p2c", position_biased_input=True, share_att_key=False)
    config.update(label_fields(num_labels))
    config.update(overrides)
    return dict(sorted(config.items()))


def fixture_weights(config: dict[str, Any], num_labels: int | None, seed: int) -> dict[str, np.ndarray]:
    """Random float32 tensors for CONFIG under the names of transformers' `DebertaV2Model.state_dict()`
    (or `DebertaV2ForSequenceClassification`'s, `deberta.`-prefixed, with the pooler and classifier)."""
    cfg = DebertaV2Config.from_dict(config)
    t = FixtureTensors(seed)
    h, e, inner = cfg.hidden_size, cfg.embedding_size, cfg.num_attention_heads * cfg.attention_head_size
    base = "deberta." if num_labels is not None else ""
    out = {f"{base}embeddings.word_embeddings.weight": t.normal(cfg.vocab_size, e)}
    if cfg.position_biased_input:
        out[f"{base}embeddings.position_embeddings.weight"] = t.normal(cfg.max_position_embeddings, e)
    if cfg.type_vocab_size > 0:
        out[f"{base}embeddings.token_type_embeddings.weight"] = t.normal(cfg.type_vocab_size, e)
    if e != h:
        out.update(t.linear(f"{base}embeddings.embed_proj", h, e, bias=False))
    out.update(t.norm(f"{base}embeddings.LayerNorm", h))
    enc = f"{base}encoder."
    own = cfg.relative_attention and not cfg.share_att_key
    for i in range(cfg.num_hidden_layers):
        p = f"{enc}layer.{i}."
        for name in ("query_proj", "key_proj", "value_proj"):
            out.update(t.linear(f"{p}attention.self.{name}", inner, h))
        if own and "c2p" in cfg.pos_att_type:
            out.update(t.linear(f"{p}attention.self.pos_key_proj", inner, h))
        if own and "p2c" in cfg.pos_att_type:
            out.update(t.linear(f"{p}attention.self.pos_query_proj", inner, h))
        out.update(t.linear(f"{p}attention.output.dense", h, inner))
        out.update(t.norm(f"{p}attention.output.LayerNorm", h))
        out.update(t.linear(f"{p}intermediate.dense", cfg.intermediate_size, h))
        out.update(t.linear(f"{p}output.dense", h, cfg.intermediate_size))
        out.update(t.norm(f"{p}output.LayerNorm", h))
    if cfg.relative_attention:
        out[f"{enc}rel_embeddings.weight"] = t.normal(2 * cfg.relative_span, h)
    if "layer_norm" in cfg.norm_rel_ebd:  # transformers builds it even without relative attention
        out.update(t.norm(f"{enc}LayerNorm", h))
    if cfg.conv_kernel_size > 0:
        out.update(
            {
                f"{enc}conv.conv.weight": t.normal(h, h // cfg.conv_groups, cfg.conv_kernel_size),
                f"{enc}conv.conv.bias": t.normal(h),
            }
        )
        out.update(t.norm(f"{enc}conv.LayerNorm", h))
    if num_labels is not None:
        out.update(t.linear("pooler.dense", h, h))
        out.update(t.linear("classifier", num_labels, h))
    return out
