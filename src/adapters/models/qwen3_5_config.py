"""The Qwen3.5 text backbone's configuration, read from `config.json` as transformers 5.x writes it.

Two layouts carry the same text model:
- text-only (`model_type: qwen3_5_text`, `Qwen3_5ForCausalLM` and the heads built on it): the
  fields at the top level, weights under `model.*`;
- multimodal (`model_type: qwen3_5`, `Qwen3_5ForConditionalGeneration`): the text model's fields
  under `text_config`, its weights under `model.language_model.*` beside the vision tower's
  `model.visual.*` (not read here), `lm_head` tied or not by the top level's `tie_word_embeddings`.

Layers follow `layer_types` (`linear_attention`: Gated DeltaNet; `full_attention`: gated
attention); without it every `full_attention_interval`-th layer (default 4) is full, as
transformers derives it. Rotary embeddings: `rope_parameters` (or the 4.x `rope_theta` /
`partial_rotary_factor` / `rope_scaling`), default type only, on the first `partial_rotary_factor`
of each head (0.25 unless said). The multimodal rotary sections (`mrope_section`) give text the
plain rotary: a text token's three position streams are equal.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TEXT_TYPE = "qwen3_5_text"
MULTIMODAL_TYPE = "qwen3_5"
MODEL_TYPES = frozenset({TEXT_TYPE, MULTIMODAL_TYPE})
LINEAR, FULL = "linear_attention", "full_attention"


@dataclass(frozen=True)
class Qwen35Config:
    model_type: str  # the package's: qwen3_5_text or qwen3_5
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    layer_types: tuple[str, ...]
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rotary_dim: int  # the leading dims of each head that turn (head_dim × partial_rotary_factor)
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    conv_kernel: int
    linear_key_heads: int
    linear_value_heads: int
    linear_key_dim: int
    linear_value_dim: int

    @property
    def num_layers(self) -> int:
        return len(self.layer_types)

    @property
    def key_dim(self) -> int:
        """Width of a Gated DeltaNet layer's queries (and keys): key heads × key head dim."""
        return self.linear_key_heads * self.linear_key_dim

    @property
    def value_dim(self) -> int:
        return self.linear_value_heads * self.linear_value_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the depthwise convolution: queries, keys and values side by side."""
        return 2 * self.key_dim + self.value_dim

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Qwen35Config:
        model_type = str(raw.get("model_type", "")).lower()
        if model_type not in MODEL_TYPES:
            raise ValueError(f"Qwen3.5 model_type {model_type!r} is not supported (known: {sorted(MODEL_TYPES)})")
        if model_type == MULTIMODAL_TYPE:
            text = raw.get("text_config")
            if not isinstance(text, dict):
                raise ValueError("a qwen3_5 config needs its text model's fields under text_config")
            tied = bool(raw.get("tie_word_embeddings", False))  # the multimodal class ties by its own field
        else:
            text, tied = raw, bool(raw.get("tie_word_embeddings", False))
        return _text(text, model_type, tied)

    @classmethod
    def from_folder(cls, folder: str | Path) -> Qwen35Config:
        return cls.from_dict(json.loads((Path(folder) / "config.json").read_text(encoding="utf-8")))


def text_fields(raw: dict[str, Any]) -> dict[str, Any]:
    """The text model's fields of a config.json: `text_config` for the multimodal layout, else itself."""
    if str(raw.get("model_type", "")).lower() == MULTIMODAL_TYPE and isinstance(raw.get("text_config"), dict):
        return raw["text_config"]
    return raw


def _int(raw: dict[str, Any], key: str, default: int | None = None) -> int:
    value = raw.get(key, default)
    if value is None:
        raise ValueError(f"Qwen3.5 config: {key} is missing")
    return int(value)


def _text(raw: dict[str, Any], model_type: str, tied: bool) -> Qwen35Config:
    act = raw.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ValueError(f"Qwen3.5 hidden_act {act!r} is not supported (only silu)")
    if raw.get("num_experts") or raw.get("num_local_experts"):
        raise ValueError("Qwen3.5 mixture-of-experts layers are not supported (dense models only)")
    layers = _int(raw, "num_hidden_layers", 32)
    layer_types = raw.get("layer_types")
    if layer_types is None:
        every = _int(raw, "full_attention_interval", 4)
        layer_types = [LINEAR if (i + 1) % every else FULL for i in range(layers)]
    layer_types = tuple(str(t) for t in layer_types)
    unknown = sorted(set(layer_types) - {LINEAR, FULL})
    if unknown:
        raise ValueError(f"Qwen3.5 layer_types {unknown} are not supported (known: {LINEAR}, {FULL})")
    if len(layer_types) != layers:
        raise ValueError(f"Qwen3.5 config: {len(layer_types)} layer_types for {layers} layers")
    hidden = _int(raw, "hidden_size", 4096)
    heads = _int(raw, "num_attention_heads", 16)
    head_dim = int(raw.get("head_dim") or 256)  # transformers' default, not hidden ÷ heads
    theta, factor = _rope(raw)
    rotary = int(head_dim * factor)
    if rotary % 2 or not 0 < rotary <= head_dim:
        raise ValueError(f"Qwen3.5 rotary part {rotary} of head_dim {head_dim} must be even and within the head")
    key_heads = _int(raw, "linear_num_key_heads", 16)
    value_heads = _int(raw, "linear_num_value_heads", 32)
    if value_heads % key_heads:
        raise ValueError(f"linear_num_value_heads {value_heads} is not a multiple of linear_num_key_heads {key_heads}")
    kv_heads = _int(raw, "num_key_value_heads", 4)
    if heads % kv_heads:
        raise ValueError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
    return Qwen35Config(
        model_type=model_type,
        vocab_size=_int(raw, "vocab_size", 248320),
        hidden_size=hidden,
        intermediate_size=_int(raw, "intermediate_size", 12288),
        layer_types=layer_types,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rotary_dim=rotary,
        rope_theta=theta,
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=_int(raw, "max_position_embeddings", 32768),
        tie_word_embeddings=tied,
        attention_bias=bool(raw.get("attention_bias", False)),
        conv_kernel=_int(raw, "linear_conv_kernel_dim", 4),
        linear_key_heads=key_heads,
        linear_value_heads=value_heads,
        linear_key_dim=_int(raw, "linear_key_head_dim", 128),
        linear_value_dim=_int(raw, "linear_value_head_dim", 128),
    )


def _rope(raw: dict[str, Any]) -> tuple[float, float]:
    """(rope_theta, partial_rotary_factor) from transformers 5's `rope_parameters` or the 4.x fields."""
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise ValueError(f"rope parameters {params!r} are not understood")
    kind = params.get("rope_type") or params.get("type") or "default"
    if kind != "default":
        raise ValueError(f"rope scaling type {kind!r} is not supported (only default rotary embeddings)")
    theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    factor = float(params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 0.25)))
    return theta, factor
