"""Tiny random-weight Qwen3.5 decision packages (R-PKG-3), deterministic by seed.

Variants (`vllm-srun fixture --family decision --variant …`):
- `qwen3_5`: the text-only layout transformers saves for `Qwen3_5ForCausalLM` (`model_type:
  qwen3_5_text`, weights under `model.*`, untied `lm_head`);
- `qwen3_5_mm`: the multimodal layout of `Qwen3_5ForConditionalGeneration` (`model_type: qwen3_5`,
  the text model under `text_config`, its weights under `model.language_model.*`, tied embeddings),
  with a one-block vision tower (`model.visual.*`) and a multi-token-prediction tensor (`mtp.*`)
  that the decision family does not read.
Both: 4 layers in transformers' default order (three Gated DeltaNet, one gated full attention),
hidden 64, 4 query heads of 16 over 2 KV heads, a quarter of each head rotary, linear attention
with 2 key heads and 4 value heads of 16, a kernel-4 convolution. The tokenizer is Qwen3.5's
byte-level BPE (`fixture_tokenizers`, the decision fixture's words and Yes / No whole), the
prompt template ChatML with an empty thinking block. Weights come from numpy's PCG64 generator (FP32
safetensors); `srun.json` declares the published precision (BF16). The golden requests are the
decision fixture's (`decision_fixture.py`, which calls this writer); the golden file is recorded
at FP32 on a CPU like every decision fixture's.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vllm_srun.adapters.families.decision_package import write_decision_package

VARIANTS = ("qwen3_5", "qwen3_5_mm")
SIZES = {
    "hidden": 64,
    "layers": 4,
    "heads": 4,
    "kv_heads": 2,
    "head_dim": 16,
    "intermediate": 128,
    "linear_key_heads": 2,
    "linear_value_heads": 4,
    "linear_head_dim": 16,
}
POSITIONS = 1024
ANSWER_WORDS = ("Yes", "No")  # a noul question's answer tokens: whole tokens, as in Qwen's vocabulary
VISION: dict[
    str, Any
] = {  # the smallest tower transformers builds: what a multimodal package carries beside the text model
    "depth": 1,
    "hidden_size": 16,
    "hidden_act": "gelu_pytorch_tanh",
    "intermediate_size": 32,
    "num_heads": 2,
    "in_channels": 3,
    "patch_size": 4,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "num_position_embeddings": 16,
    "model_type": "qwen3_5_vision",
}


def text_config(vocab: int, positions: int = POSITIONS, **sizes: int) -> dict[str, Any]:
    """The text model's config.json fields as transformers 5.x writes `Qwen3_5TextConfig`."""
    s = {**SIZES, **sizes}
    layers = s["layers"]
    return {
        "model_type": "qwen3_5_text",
        "vocab_size": vocab,
        "hidden_size": s["hidden"],
        "intermediate_size": s["intermediate"],
        "num_hidden_layers": layers,
        "num_attention_heads": s["heads"],
        "num_key_value_heads": s["kv_heads"],
        "head_dim": s["head_dim"],
        "hidden_act": "silu",
        "max_position_embeddings": positions,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": s["linear_head_dim"],
        "linear_value_head_dim": s["linear_head_dim"],
        "linear_num_key_heads": s["linear_key_heads"],
        "linear_num_value_heads": s["linear_value_heads"],
        "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)],
        "bos_token_id": None,
        "eos_token_id": None,
        "pad_token_id": None,
    }


def text_tensors(config: dict[str, Any], seed: int, prefix: str = "model.") -> dict[str, np.ndarray]:
    """Random FP32 weights of the text model under transformers' names (after PREFIX): matrices
    normal(0, 1/√fan-in), embeddings normal(0, 0.25), zero-centred norms near 0, the gated norm
    near 1, decays A = exp(A_log) in [0.1, 2] and dt_bias near 0."""
    rng = np.random.default_rng(seed)

    def matrix(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def around(center: float, size: int, spread: float = 0.1) -> np.ndarray:
        return (center + spread * rng.standard_normal(size)).astype(np.float32)

    hidden, heads, kv, hd = (
        config[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim")
    )
    kh, vh = config["linear_num_key_heads"], config["linear_num_value_heads"]
    kd, vd, kernel = config["linear_key_head_dim"], config["linear_value_head_dim"], config["linear_conv_kernel_dim"]
    inter = config["intermediate_size"]
    conv = 2 * kh * kd + vh * vd
    table = 0.25 * rng.standard_normal((config["vocab_size"], hidden))  # tied: logits of a few units
    out = {prefix + "embed_tokens.weight": table.astype(np.float32)}
    for i, kind in enumerate(config["layer_types"]):
        p = f"{prefix}layers.{i}."
        out[p + "input_layernorm.weight"] = around(0.0, hidden)
        out[p + "post_attention_layernorm.weight"] = around(0.0, hidden)
        if kind == "linear_attention":
            a = p + "linear_attn."
            out[a + "in_proj_qkv.weight"] = matrix(conv, hidden)
            out[a + "in_proj_z.weight"] = matrix(vh * vd, hidden)
            out[a + "in_proj_b.weight"] = matrix(vh, hidden)
            out[a + "in_proj_a.weight"] = matrix(vh, hidden)
            out[a + "conv1d.weight"] = (rng.standard_normal((conv, 1, kernel)) / np.sqrt(kernel)).astype(np.float32)
            out[a + "A_log"] = np.log(rng.uniform(0.1, 2.0, vh)).astype(np.float32)
            out[a + "dt_bias"] = around(0.0, vh, 0.5)
            out[a + "norm.weight"] = around(1.0, vd)
            out[a + "out_proj.weight"] = matrix(hidden, vh * vd)
        else:
            a = p + "self_attn."
            out[a + "q_proj.weight"] = matrix(2 * heads * hd, hidden)
            out[a + "k_proj.weight"] = matrix(kv * hd, hidden)
            out[a + "v_proj.weight"] = matrix(kv * hd, hidden)
            out[a + "o_proj.weight"] = matrix(hidden, heads * hd)
            out[a + "q_norm.weight"] = around(0.0, hd)
            out[a + "k_norm.weight"] = around(0.0, hd)
        out[p + "mlp.gate_proj.weight"] = matrix(inter, hidden)
        out[p + "mlp.up_proj.weight"] = matrix(inter, hidden)
        out[p + "mlp.down_proj.weight"] = matrix(hidden, inter)
    out[prefix + "norm.weight"] = around(0.0, hidden)
    return out


def vision_tensors(out_hidden: int, seed: int) -> dict[str, np.ndarray]:
    """The one-block vision tower's weights (`model.visual.*`), shapes as transformers builds VISION."""
    rng = np.random.default_rng(seed + 1)
    v = VISION
    h, inter, merged = v["hidden_size"], v["intermediate_size"], v["hidden_size"] * v["spatial_merge_size"] ** 2
    shapes = {
        "patch_embed.proj.weight": (h, v["in_channels"], v["temporal_patch_size"], v["patch_size"], v["patch_size"]),
        "patch_embed.proj.bias": (h,),
        "pos_embed.weight": (v["num_position_embeddings"], h),
        "blocks.0.norm1.weight": (h,),
        "blocks.0.norm1.bias": (h,),
        "blocks.0.norm2.weight": (h,),
        "blocks.0.norm2.bias": (h,),
        "blocks.0.attn.qkv.weight": (3 * h, h),
        "blocks.0.attn.qkv.bias": (3 * h,),
        "blocks.0.attn.proj.weight": (h, h),
        "blocks.0.attn.proj.bias": (h,),
        "blocks.0.mlp.linear_fc1.weight": (inter, h),
        "blocks.0.mlp.linear_fc1.bias": (inter,),
        "blocks.0.mlp.linear_fc2.weight": (h, inter),
        "blocks.0.mlp.linear_fc2.bias": (h,),
        "merger.norm.weight": (h,),
        "merger.norm.bias": (h,),
        "merger.linear_fc1.weight": (merged, merged),
        "merger.linear_fc1.bias": (merged,),
        "merger.linear_fc2.weight": (out_hidden, merged),
        "merger.linear_fc2.bias": (out_hidden,),
    }
    return {f"model.visual.{k}": (0.1 * rng.standard_normal(s)).astype(np.float32) for k, s in shapes.items()}


_vision_tensors = vision_tensors  # the old name, until qwen3_5_encoder_fixture.py calls vision_tensors


def write_qwen3_5_fixture(out: Path, variant: str, seed: int, words: Sequence[str]) -> None:
    """Write VARIANT into OUT (module doc), WORDS whole tokens of its tokenizer."""

    from vllm_srun.adapters.models.fixture_tokenizers import write_fixture_tokenizer

    if variant not in VARIANTS:
        raise ValueError(f"Qwen3.5 decision fixtures come in variants {', '.join(VARIANTS)} (got {variant!r})")
    out = Path(out)
    info = write_fixture_tokenizer(out, "qwen3_5", [*words, *ANSWER_WORDS], model_max_length=POSITIONS)
    text = text_config(info.vocab_size)
    text["eos_token_id"] = info.eos_token_id
    if variant == "qwen3_5":
        config: dict[str, Any] = {"architectures": ["Qwen3_5ForCausalLM"], **text, "dtype": "bfloat16"}
        tensors = text_tensors(text, seed)
        tensors["lm_head.weight"] = (rng_matrix(seed, info.vocab_size, text["hidden_size"])).astype(np.float32)
    else:
        text["tie_word_embeddings"] = True
        config = {
            "architectures": ["Qwen3_5ForConditionalGeneration"],
            "model_type": "qwen3_5",
            "text_config": text,
            "vision_config": {**VISION, "out_hidden_size": text["hidden_size"]},
            "tie_word_embeddings": True,
            "image_token_id": info.vocab_size,  # past the vocabulary: no text token is taken for an image
            "video_token_id": info.vocab_size + 1,
            "vision_start_token_id": info.vocab_size + 2,
            "vision_end_token_id": info.vocab_size + 3,
            "dtype": "bfloat16",
        }
        tensors = text_tensors(text, seed, prefix="model.language_model.")
        tensors.update(vision_tensors(text["hidden_size"], seed))
        tensors["mtp.fc.weight"] = rng_matrix(seed + 2, text["hidden_size"], 2 * text["hidden_size"])
    write_decision_package(
        out,
        config,
        tensors,
        template="chatml-think",
        max_input_tokens=POSITIONS,
        fixture={"variant": variant, "seed": seed},
    )


def rng_matrix(seed: int, rows: int, cols: int) -> np.ndarray:
    """normal(0, 1/√cols) [ROWS, COLS] from its own generator (a head, a side tensor)."""
    rng = np.random.default_rng([seed, rows, cols])
    return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)
