"""`models/answer_logits.py`: a question's answer logits picked from full logits, or computed from
the last hidden states at the answer tokens only; both flat, row by row, in the order given."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_srun.adapters.models.answer_logits import answer_rows, pick

VOCAB, HIDDEN = 50, 24


def _case(seed: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, HIDDEN, generator=gen), torch.randn(VOCAB, HIDDEN, generator=gen)


def test_pick_takes_each_rows_tokens_in_the_order_given() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0], [5.0, -1.0, 0.5, 0.0]])
    assert pick(logits, [[3, 1], [0, 2, 1]]).tolist() == [3.0, 1.0, 5.0, 0.5, -1.0]
    with pytest.raises(ValueError, match="2 rows of logits for 1 answer sets"):
        pick(logits, [[0, 1]])


answer_sets = st.lists(st.lists(st.integers(0, VOCAB - 1), min_size=2, max_size=5, unique=True), min_size=1, max_size=6)


@settings(max_examples=60, deadline=None)
@given(tokens=answer_sets, seed=st.integers(0, 2**16))
def test_answer_rows_are_the_full_products_at_the_answer_tokens(tokens: list[list[int]], seed: int) -> None:
    hidden, weight = _case(seed, len(tokens))
    got = answer_rows(hidden, weight, tokens)
    assert got.shape == (sum(len(t) for t in tokens),)
    torch.testing.assert_close(got, pick(hidden @ weight.T, tokens), atol=1e-5, rtol=1e-5)


@settings(max_examples=60, deadline=None)
@given(tokens=answer_sets, others=answer_sets, seed=st.integers(0, 2**16))
def test_a_pairs_bits_do_not_depend_on_the_other_pairs(
    tokens: list[list[int]], others: list[list[int]], seed: int
) -> None:
    hidden, weight = _case(seed, len(tokens) + len(others))
    together = answer_rows(hidden, weight, tokens + others)
    start = 0
    for i, ids in enumerate(tokens):
        alone = answer_rows(hidden[i : i + 1], weight, [ids])
        assert torch.equal(alone, together[start : start + len(ids)])
        start += len(ids)


def test_answer_rows_refuses_what_does_not_fit() -> None:
    hidden, weight = _case(0, 2)
    with pytest.raises(ValueError, match="2 hidden states for 1 answer sets"):
        answer_rows(hidden, weight, [[1, 2]])
    with pytest.raises(ValueError, match="outside the vocabulary of 50"):
        answer_rows(hidden, weight, [[1, 2], [3, VOCAB]])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        answer_rows(hidden, weight, [[-1, 2], [3, 4]])
