"""Shared context on the hybrid Qwen3.5 backbone (R-SC-1): the state runs once; each question
continues its recurrent state and conv tail (linear layers) and its keys and values (full
layers), all questions of a state in one forward. Every question gets the answer it gets when
`state + question` runs alone (within 1e-4), whatever the state's length (shorter than the conv
kernel, across chunk boundaries) and the questions' (across a chunk).

In FP64 the two agree to 1e-10: the continuation is the same arithmetic. In FP32 the gap is
rounding, which random models amplify (at this width, weights of std 0.1: each path's logits
within 7e-5 of the FP64 ones, the two up to 1.0e-4 apart; at std 0.15 the unshared logits are
2e-4 off FP64, the shared 3e-5). So at the logits each layout is held to the exact (FP64)
logits within 1e-4, as the unshared FP32 logits are; the answers a decision model returns (the
softmax over a question's answer tokens) are held to the unshared ones within 1e-4."""

from __future__ import annotations

import pytest
import torch

from vllm_srun.adapters.models.qwen3_5 import Qwen35LM
from vllm_srun.adapters.models.qwen3_5_config import Qwen35Config

TOL = 1e-4


def _config(**changes) -> Qwen35Config:
    raw = dict(
        model_type="qwen3_5_text",
        vocab_size=211,
        hidden_size=48,
        intermediate_size=72,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        max_position_embeddings=2048,
    )
    raw.update(changes)
    return Qwen35Config.from_dict(raw)


MODELS = {
    "gqa-tied": _config(tie_word_embeddings=True),
    "full-first-mha": _config(
        num_key_value_heads=4, layer_types=["full_attention", "linear_attention", "full_attention", "linear_attention"]
    ),
}


STD = 0.1
ANSWER_TOKENS = (3, 17, 40, 101)  # a choice question's answer tokens, for every question


@pytest.fixture(scope="module", params=sorted(MODELS))
def pair(request) -> tuple[Qwen35LM, Qwen35LM]:
    """The model in FP32, and the same weights in FP64 (the exact reference)."""
    config = MODELS[request.param]
    return Qwen35LM.random(config, seed=3, std=STD), Qwen35LM.random(config, seed=3, std=STD, dtype=torch.float64)


@pytest.fixture(scope="module")
def model(pair) -> Qwen35LM:
    return pair[0]


@pytest.fixture(scope="module")
def exact(pair) -> Qwen35LM:
    return pair[1]


def _answers(logits: torch.Tensor) -> torch.Tensor:
    return torch.softmax(logits[:, list(ANSWER_TOKENS)].double(), -1)


def _case(count: int, vocab: int, state_len: int = 37, max_q: int = 11, seed: int = 0):
    gen = torch.Generator().manual_seed(seed + count)
    state = torch.randint(0, vocab, (state_len,), generator=gen).tolist()
    sizes = torch.randint(1, max_q + 1, (count,), generator=gen).tolist()
    return state, [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in sizes]


def _layouts(model: Qwen35LM, state: list[int], questions: list[list[int]]) -> dict[str, torch.Tensor]:
    kept = model.prefix_kv(state)
    out = {
        "branch": model.branch_logits(kept, questions),
        "branch-chunks-of-3": model.branch_logits(kept, questions, chunk=3),
    }
    model.split_attention = False
    try:
        out["branch-copies"] = model.branch_logits(kept, questions)
    finally:
        model.split_attention = True
    return out


@pytest.mark.parametrize("count", [1, 2, 16, 128])
def test_shared_answers_equal_each_question_alone(model, exact, count):
    state, questions = _case(count, model.config.vocab_size)
    rows = [state + q for q in questions]
    unshared, truth = model.packed_logits(rows), exact.packed_logits(rows)
    torch.testing.assert_close(unshared.double(), truth, atol=TOL, rtol=0)
    for name, got in _layouts(model, state, questions).items():
        assert got.shape == (count, model.config.vocab_size), name
        torch.testing.assert_close(got.double(), truth, atol=TOL, rtol=0, msg=lambda m, n=name: f"{n}: {m}")
        torch.testing.assert_close(_answers(got), _answers(unshared), atol=TOL, rtol=0)


@pytest.mark.parametrize(("state_len", "max_q"), [(1, 1), (2, 5), (3, 70), (64, 9), (130, 70)])
def test_states_and_questions_of_every_length(model, exact, state_len, max_q):
    """States shorter than the conv kernel (its tail reaches before the state: zeros), states and
    questions across the delta rule's 64-token chunks."""
    state, questions = _case(6, model.config.vocab_size, state_len=state_len, max_q=max_q, seed=state_len)
    rows = [state + q for q in questions]
    unshared, truth = model.packed_logits(rows), exact.packed_logits(rows)
    for name, got in _layouts(model, state, questions).items():
        torch.testing.assert_close(got.double(), truth, atol=TOL, rtol=0, msg=lambda m, n=name: f"{n}: {m}")
        torch.testing.assert_close(_answers(got), _answers(unshared), atol=TOL, rtol=0)


@pytest.mark.parametrize(("state_len", "max_q"), [(2, 5), (37, 11), (130, 70)])
def test_in_fp64_shared_and_unshared_are_the_same_arithmetic(exact, state_len, max_q):
    state, questions = _case(8, exact.config.vocab_size, state_len=state_len, max_q=max_q, seed=state_len)
    expected = exact.packed_logits([state + q for q in questions])
    assert expected.dtype == torch.float64
    for name, got in _layouts(exact, state, questions).items():
        torch.testing.assert_close(got, expected, atol=1e-10, rtol=0, msg=lambda m, n=name: f"{n}: {m}")


def test_each_question_alone_through_the_padded_api(model):
    state, questions = _case(5, model.config.vocab_size, seed=9)
    kept = model.prefix_kv(state)
    for q, got in zip(questions, model.branch_logits(kept, questions), strict=True):
        torch.testing.assert_close(got, model.logits_at(torch.tensor([state + q]))[0], atol=TOL, rtol=0)


def test_question_order_changes_no_answer(model):
    state, questions = _case(16, model.config.vocab_size, seed=5)
    order = torch.randperm(16, generator=torch.Generator().manual_seed(1)).tolist()
    kept = model.prefix_kv(state)
    first = model.branch_logits(kept, questions)
    shuffled = model.branch_logits(kept, [questions[i] for i in order])
    torch.testing.assert_close(shuffled, first[order], atol=1e-5, rtol=0)


def test_padded_tensor_input(model):
    state, questions = _case(9, model.config.vocab_size, seed=7)
    width = max(map(len, questions))
    ids = torch.full((9, width), 5, dtype=torch.long)  # the padding value must not matter
    for i, q in enumerate(questions):
        ids[i, : len(q)] = torch.tensor(q)
    kept = model.prefix_kv(torch.tensor([state]))
    lists = model.branch_logits(kept, questions)
    torch.testing.assert_close(model.branch_logits(kept, ids, [len(q) for q in questions]), lists, atol=1e-6, rtol=0)


def test_the_state_is_not_changed_by_its_branches(model):
    state, questions = _case(4, model.config.vocab_size, seed=11)
    kept = model.prefix_kv(state)
    snapshot = [{k: (v.clone() if v is not None else None) for k, v in vars(layer).items()} for layer in kept.layers]
    first = model.branch_logits(kept, questions)
    again = model.branch_logits(kept, questions)
    assert torch.equal(first, again)
    for layer, before in zip(kept.layers, snapshot, strict=True):
        for k, v in vars(layer).items():
            assert (v is None and before[k] is None) or torch.equal(v, before[k]), k


def test_empty_inputs_are_refused(model):
    with pytest.raises(ValueError, match="state"):
        model.prefix_kv([])
    kept = model.prefix_kv([1, 2, 3])
    with pytest.raises(ValueError, match="question"):
        model.branch_logits(kept, [[1], []])
    assert model.branch_logits(kept, []).shape == (0, model.config.vocab_size)
