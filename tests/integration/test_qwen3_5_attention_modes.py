"""The attention modes (R-Q35-3) on the Qwen3.5 text backbone: what a query sees (every length,
state length and mode), the package's declaration, and a state run once with its questions
branched from it equalling each question run whole in every mode (FP64: the same arithmetic)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from vllm_srun.adapters.models.qwen3_5 import Qwen35LM, read_attention_mode
from vllm_srun.adapters.models.qwen3_5_config import Qwen35Config
from vllm_srun.adapters.models.qwen3_5_layers import ATTENTION_MODES, visibility_mask

CONFIG = {
    "model_type": "qwen3_5_text",
    "vocab_size": 61,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 3,
    "layer_types": ["full_attention", "linear_attention", "full_attention"],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 8,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
}


@given(st.integers(1, 24), st.integers(0, 30), st.sampled_from(ATTENTION_MODES))
def test_what_a_query_sees(length: int, state: int, mode: str):
    mask = visibility_mask(length, state, mode)
    sees = torch.ones(length, length, dtype=torch.bool) if mask is None else mask
    s = min(state, length)
    for i in range(length):
        for j in range(length):
            if mode == "causal":
                expected = j <= i
            elif i < s:  # a state token: never a question token; the state both ways or up to itself
                expected = j < s and (mode == "prefix_bidir" or j <= i)
            else:  # a question token: the whole state and all of its question
                expected = True
            assert bool(sees[i, j]) == expected, (i, j)


def test_the_package_declares_its_mode(tmp_path: Path):
    assert read_attention_mode(tmp_path) == "causal"
    (tmp_path / "config.json").write_text(json.dumps({"attention_mode": "prefix_causal"}))
    assert read_attention_mode(tmp_path) == "prefix_causal"
    (tmp_path / "srun.json").write_text(json.dumps({"attention_mode": "prefix_bidir"}))
    assert read_attention_mode(tmp_path) == "prefix_bidir"  # srun.json first
    (tmp_path / "srun.json").write_text(json.dumps({"attention_mode": "noncausal_full_attention"}))
    with pytest.raises(ValueError, match="is not one of causal, prefix_bidir, prefix_causal"):
        read_attention_mode(tmp_path)


@pytest.mark.parametrize("mode", ATTENTION_MODES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_branches_equal_whole_rows(mode: str, dtype: torch.dtype):
    lm = Qwen35LM.random(Qwen35Config.from_dict(CONFIG), seed=4, std=0.2, dtype=dtype)
    lm.attention_mode = mode
    state = [(7 * i + 3) % 61 for i in range(23)]
    questions = [[5, 9, 11], [2] * 17, [40, 41]]
    branched = lm.branch_logits(lm.prefix_kv(state), questions)
    rows = [state + q for q in questions]
    whole = lm.packed_logits(rows, state_lengths=[len(state)] * len(rows))
    tol = 1e-10 if dtype == torch.float64 else 1e-4
    assert (branched - whole).abs().max().item() <= tol
    padded = torch.zeros(len(rows), max(map(len, rows)), dtype=torch.long)
    for r, row in enumerate(rows):
        padded[r, : len(row)] = torch.tensor(row)
    ends = torch.tensor([len(r) - 1 for r in rows])
    at = lm.logits_at(padded, positions=ends, state_lengths=[len(state)] * len(rows))
    assert (at - whole).abs().max().item() <= tol
    cu = [0, len(rows[0]), len(rows[0]) + len(rows[1])]
    hidden = lm.hidden_states(torch.tensor(rows[0] + rows[1]), cu, state_lengths=[len(state)] * 2)
    assert torch.allclose(hidden[: len(state)], hidden[cu[1] : cu[1] + len(state)], atol=1e-6, rtol=0)
    if mode != "causal":
        lm.attention_mode = "causal"
        assert (lm.packed_logits(rows) - whole).abs().max().item() > 1e-3  # the mode is in force
