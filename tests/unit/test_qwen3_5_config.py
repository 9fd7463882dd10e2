"""The Qwen3.5 text config as transformers 5.x writes it (R-PKG-2): both layouts, the layer order,
the rotary fields of both config generations, and one-line refusals of what we do not serve."""

from __future__ import annotations

from typing import Any

import pytest

from vllm_srun.adapters.models.qwen3_5_config import Qwen35Config, text_fields

TEXT: dict[str, Any] = {
    "model_type": "qwen3_5_text",
    "vocab_size": 100,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 8,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
}


def test_text_only_layout() -> None:
    c = Qwen35Config.from_dict(TEXT)
    assert c.layer_types == ("linear_attention",) * 3 + ("full_attention",) + ("linear_attention",) * 3 + (
        "full_attention",
    )  # every fourth layer full, as transformers derives it
    assert (c.rotary_dim, c.rope_theta, c.tie_word_embeddings) == (4, 1e7, False)
    assert (c.key_dim, c.value_dim, c.conv_dim) == (32, 48, 112)


def test_multimodal_layout_reads_text_config_and_ties_by_the_top_level() -> None:
    raw = {
        "model_type": "qwen3_5",
        "text_config": {**TEXT, "tie_word_embeddings": False},
        "vision_config": {"depth": 1},
        "tie_word_embeddings": True,
    }
    c = Qwen35Config.from_dict(raw)
    assert c.model_type == "qwen3_5" and c.tie_word_embeddings is True and c.hidden_size == 64
    assert text_fields(raw) is raw["text_config"] and text_fields(TEXT) is TEXT


def test_explicit_layer_types_and_interval() -> None:
    order = ["full_attention", "linear_attention"] * 4
    assert Qwen35Config.from_dict({**TEXT, "layer_types": order}).layer_types == tuple(order)
    two = Qwen35Config.from_dict({**TEXT, "full_attention_interval": 2})
    assert two.layer_types == ("linear_attention", "full_attention") * 4


def test_rotary_fields_of_transformers_4_and_defaults() -> None:
    old = {k: v for k, v in TEXT.items() if k != "rope_parameters"}
    c = Qwen35Config.from_dict({**old, "rope_theta": 5e5, "partial_rotary_factor": 0.5})
    assert (c.rope_theta, c.rotary_dim) == (5e5, 8)
    bare = Qwen35Config.from_dict(old)  # transformers' defaults: theta 10000, a quarter of each head
    assert (bare.rope_theta, bare.rotary_dim) == (10000.0, 4)
    mrope = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [1, 1, 0], "mrope_interleaved": True}
    assert Qwen35Config.from_dict({**TEXT, "rope_parameters": mrope}).rotary_dim == 4


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"model_type": "qwen3"}, "model_type"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"num_experts": 8}, "mixture-of-experts"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}}, "rope scaling"),
        ({"layer_types": ["sliding_attention"] * 8}, "layer_types"),
        ({"layer_types": ["full_attention"] * 3}, "3 layer_types for 8 layers"),
        ({"linear_num_value_heads": 3}, "multiple of linear_num_key_heads"),
        ({"num_key_value_heads": 3}, "multiple of num_key_value_heads"),
        ({"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.1}}, "rotary part"),
    ],
)
def test_what_we_do_not_serve_is_refused_in_one_line(change: dict[str, Any], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        Qwen35Config.from_dict({**TEXT, **change})


def test_a_multimodal_config_without_its_text_part_is_refused() -> None:
    with pytest.raises(ValueError, match="text_config"):
        Qwen35Config.from_dict({"model_type": "qwen3_5", "vision_config": {}})
