"""Shared context at the model level (R-SC-1): a state run once, questions branched from it.

Every layout must give each question the answer it gets when `state + question` runs alone.
"""

from __future__ import annotations

import pytest
import torch

from vllm_srun.adapters.models.decoder import DecoderConfig, DecoderLM

TOL = 1e-4


def _config(**changes) -> DecoderConfig:
    base = dict(
        model_type="llama",
        vocab_size=211,
        hidden_size=48,
        intermediate_size=72,
        num_layers=2,
        num_heads=6,
        num_kv_heads=2,
        head_dim=8,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
    )
    base.update(changes)
    return DecoderConfig(**base)


MODELS = {
    "llama-gqa": _config(),
    "llama-mha-untied": _config(num_kv_heads=6, tie_word_embeddings=False),
    "qwen2-bias": _config(model_type="qwen2", qkv_bias=True),
    "qwen3-qknorm": _config(model_type="qwen3", qk_norm=True, num_kv_heads=3, head_dim=16),
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def model(request) -> DecoderLM:
    return DecoderLM.random(MODELS[request.param], seed=3, std=0.15)


def _case(count: int, vocab: int, state_len: int = 37, max_q: int = 11, seed: int = 0):
    gen = torch.Generator().manual_seed(seed + count)
    state = torch.randint(0, vocab, (state_len,), generator=gen).tolist()
    sizes = torch.randint(1, max_q + 1, (count,), generator=gen).tolist()
    return state, [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in sizes]


def _alone(model: DecoderLM, state: list[int], questions: list[list[int]], rows: int = 32) -> torch.Tensor:
    """Each question run as its own `state + question` row (right-padded batches)."""
    out = []
    for lo in range(0, len(questions), rows):
        batch = [state + q for q in questions[lo : lo + rows]]
        width = max(map(len, batch))
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, r in enumerate(batch):
            ids[i, : len(r)], mask[i, : len(r)] = torch.tensor(r), 1
        out.append(model.logits_at(ids, mask))
    return torch.cat(out)


def _layouts(model: DecoderLM, state: list[int], questions: list[list[int]]) -> dict[str, torch.Tensor]:
    kv = model.prefix_kv(state)
    out = {"branch": model.branch_logits(kv, questions), "packed": model.packed_tree_logits(state, questions)}
    model.split_attention = False
    try:
        out["branch-copies"] = model.branch_logits(kv, questions)
    finally:
        model.split_attention = True
    return out


@pytest.mark.parametrize("count", [1, 2, 16, 128])
def test_shared_answers_equal_each_question_alone(model, count):
    state, questions = _case(count, model.config.vocab_size)
    expected = _alone(model, state, questions)
    for name, got in _layouts(model, state, questions).items():
        assert got.shape == (count, model.config.vocab_size), name
        torch.testing.assert_close(got, expected, atol=TOL, rtol=0, msg=lambda m, n=name: f"{n}: {m}")


def test_question_order_changes_no_answer(model):
    state, questions = _case(16, model.config.vocab_size, seed=5)
    order = torch.randperm(16, generator=torch.Generator().manual_seed(1)).tolist()
    kv = model.prefix_kv(state)
    first = model.branch_logits(kv, questions)
    shuffled = model.branch_logits(kv, [questions[i] for i in order])
    torch.testing.assert_close(shuffled, first[order], atol=1e-5, rtol=0)
    packed = model.packed_tree_logits(state, [questions[i] for i in order])
    torch.testing.assert_close(packed, first[order], atol=TOL, rtol=0)


def test_padded_tensor_input_and_chunks(model):
    state, questions = _case(9, model.config.vocab_size, seed=7)
    width = max(map(len, questions))
    ids = torch.full((9, width), 5, dtype=torch.long)  # padding value must not matter
    for i, q in enumerate(questions):
        ids[i, : len(q)] = torch.tensor(q)
    lengths = [len(q) for q in questions]
    kv = model.prefix_kv(torch.tensor([state]))
    lists = model.branch_logits(kv, questions)
    torch.testing.assert_close(model.branch_logits(kv, ids, lengths), lists, atol=1e-5, rtol=0)
    torch.testing.assert_close(model.branch_logits(kv, ids, torch.tensor(lengths), chunk=4), lists, atol=1e-5, rtol=0)
    torch.testing.assert_close(model.packed_tree_logits(state, ids, lengths), lists, atol=TOL, rtol=0)


def test_one_token_state_and_questions(model):
    state, questions = _case(5, model.config.vocab_size, state_len=1, max_q=1)
    expected = _alone(model, state, questions)
    for name, got in _layouts(model, state, questions).items():
        torch.testing.assert_close(got, expected, atol=TOL, rtol=0, msg=lambda m, n=name: f"{n}: {m}")


def test_empty_inputs_are_refused(model):
    with pytest.raises(ValueError, match="state"):
        model.prefix_kv([])
    kv = model.prefix_kv([1, 2, 3])
    with pytest.raises(ValueError, match="question"):
        model.branch_logits(kv, [[1], []])
    assert model.branch_logits(kv, []).shape == (0, model.config.vocab_size)


def test_real_shape_state_of_512_tokens():
    """SmolLM2-135M's width (hidden 576, 9/3 heads, vocab 49152) with 2 layers: 512-token state."""
    config = _config(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_layers=2,
        num_heads=9,
        num_kv_heads=3,
        head_dim=64,
        rope_theta=100000.0,
        max_position_embeddings=8192,
    )
    model = DecoderLM.random(config, seed=11)
    state, questions = _case(12, config.vocab_size, state_len=512, max_q=24, seed=2)
    expected = _alone(model, state, questions, rows=4)
    for name, got in _layouts(model, state, questions).items():
        torch.testing.assert_close(got, expected, atol=TOL, rtol=0, msg=lambda m, n=name: f"{n}: {m}")
