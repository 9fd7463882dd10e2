"""Tiny random decoder-backbone packages (Qwen3 / Qwen2 / Llama) for `vllm-srun fixture` and the
tests: `fixture_config` writes config.json as transformers 5.x writes it, `fixture_weights` random
tensors under transformers' names (`decoder_encoder.py` loads them), for the bare backbone, the
causal LM and the sequence- and token-classification heads."""

from __future__ import annotations

from typing import Any

import numpy as np

from vllm_srun.adapters.models.decoder_encoder import ARCH_NAMES, SUPPORTED_TYPES
from vllm_srun.adapters.models.encoder_parts import FixtureSizes, FixtureTensors, label_fields


def fixture_config(
    vocab_size: int,
    pad_token_id: int,
    num_labels: int | None,
    *,
    model_type: str = "qwen3",
    kv_heads: int | None = None,
    head_dim: int | None = None,
    tie_word_embeddings: bool = True,
    causal_lm: bool = True,
    token: bool = False,
    **sizes: int,
) -> dict[str, Any]:
    """config.json as transformers 5.x writes it for `<Arch>ForSequenceClassification` (NUM_LABELS
    set; `<Arch>ForTokenClassification` with TOKEN), `<Arch>ForCausalLM` (CAUSAL_LM: the reranker's
    layout, also Qwen3-Embedding's) or the bare `<Arch>Model`; SIZES are `FixtureSizes`' fields.
    KV_HEADS defaults to half the heads (GQA) when that divides them."""
    size = FixtureSizes(**sizes)
    if model_type not in SUPPORTED_TYPES:
        raise ValueError(f"model_type {model_type!r} is not one of {SUPPORTED_TYPES}")
    arch = ARCH_NAMES[model_type]
    if token and num_labels is None:
        raise ValueError("a token-classification head needs its label count")
    kind = "ForCausalLM" if causal_lm else "Model"
    if num_labels is not None:
        kind = "ForTokenClassification" if token else "ForSequenceClassification"
    kv = kv_heads or (size.heads // 2 if size.heads % 2 == 0 else size.heads)
    dim = head_dim or size.hidden // size.heads
    config: dict[str, Any] = {
        "architectures": [f"{arch}{kind}"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": None,
        "dtype": "float32",
        "eos_token_id": pad_token_id,
        "head_dim": dim,
        "hidden_act": "silu",
        "hidden_size": size.hidden,
        "initializer_range": 0.02,
        "intermediate_size": size.intermediate,
        "layer_types": ["full_attention"] * size.layers,
        "max_position_embeddings": size.positions,
        "max_window_layers": 28,
        "mlp_bias": False,
        "model_type": model_type,
        "num_attention_heads": size.heads,
        "num_hidden_layers": size.layers,
        "num_key_value_heads": kv,
        "pad_token_id": pad_token_id,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "sliding_window": None,
        "tie_word_embeddings": tie_word_embeddings,
        "transformers_version": "5.24.0",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": vocab_size,
    }
    drop = {
        "qwen3": ("mlp_bias", "pretraining_tp"),
        "qwen2": ("attention_bias", "head_dim", "mlp_bias", "pretraining_tp"),
        "llama": ("layer_types", "max_window_layers", "sliding_window", "use_sliding_window"),
    }[model_type]
    for key in drop:
        config.pop(key)
    if model_type == "qwen2" and dim != size.hidden // size.heads:
        raise ValueError(
            f"qwen2 has no head_dim field: head size is hidden // heads ({size.hidden // size.heads}, not {dim})"
        )
    config.update(label_fields(num_labels))
    return dict(sorted(config.items()))


def fixture_weights(config: dict[str, Any], num_labels: int | None, seed: int) -> dict[str, np.ndarray]:
    """Random float32 tensors under the names of the config's architecture (`<Arch>Model`: no prefix;
    `…ForCausalLM` / `…ForSequenceClassification` / `…ForTokenClassification`: `model.` +
    `lm_head.weight` when untied / `score.weight` / `score.weight` and `score.bias`)."""
    t = FixtureTensors(seed)
    kind = str(config["model_type"])
    hidden, inter, vocab = int(config["hidden_size"]), int(config["intermediate_size"]), int(config["vocab_size"])
    heads = int(config["num_attention_heads"])
    kv = int(config.get("num_key_value_heads") or heads)
    dim = int(config.get("head_dim") or hidden // heads)
    architecture = str((config.get("architectures") or [""])[0])
    prefix = "" if architecture.endswith("Model") else "model."
    qkv_bias = kind == "qwen2" or bool(config.get("attention_bias"))
    o_bias = kind != "qwen2" and bool(config.get("attention_bias"))
    mlp_bias = bool(config.get("mlp_bias"))
    out = {f"{prefix}embed_tokens.weight": t.normal(vocab, hidden)}
    for i in range(int(config["num_hidden_layers"])):
        p = f"{prefix}layers.{i}."
        out.update(t.norm(p + "input_layernorm", hidden, bias=False))
        out.update(t.norm(p + "post_attention_layernorm", hidden, bias=False))
        for name, rows, cols, has_bias in (
            ("self_attn.q_proj", heads * dim, hidden, qkv_bias),
            ("self_attn.k_proj", kv * dim, hidden, qkv_bias),
            ("self_attn.v_proj", kv * dim, hidden, qkv_bias),
            ("self_attn.o_proj", hidden, heads * dim, o_bias),
            ("mlp.gate_proj", inter, hidden, mlp_bias),
            ("mlp.up_proj", inter, hidden, mlp_bias),
            ("mlp.down_proj", hidden, inter, mlp_bias),
        ):
            out.update(t.linear(p + name, rows, cols, has_bias, bias_scale=0.1))
        if kind == "qwen3":
            out.update(t.norm(p + "self_attn.q_norm", dim, bias=False))
            out.update(t.norm(p + "self_attn.k_norm", dim, bias=False))
    out.update(t.norm(f"{prefix}norm", hidden, bias=False))
    if architecture.endswith("ForCausalLM") and not config.get("tie_word_embeddings", False):
        out["lm_head.weight"] = t.normal(vocab, hidden)
    if num_labels is not None:
        out["score.weight"] = t.normal(num_labels, hidden)
    if architecture.endswith("ForTokenClassification"):
        out["score.bias"] = t.normal(int(num_labels or 0), scale=0.1)
    return out
