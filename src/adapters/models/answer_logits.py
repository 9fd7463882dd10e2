"""A question's answer logits: the next-token logits at its answer tokens only.

A decision answer is a softmax over the question's answer tokens (`decision_model._softmax_each`),
so of the output layer's V rows (151,936 on Qwen3) a row needs only those few. `pick` takes them
out of full logits [R, V] (the eager engines, whose LMs compute every row); `answer_rows` computes
them straight from the last hidden states and the output layer's weight, each (row, token) pair one
dot product over the hidden size, so an engine that uses it never reads the rest of the output layer
nor holds a second copy of it (`engines/packed_decoder.py`).

Both return the picked logits flat, [sum of len(tokens)], row 0's tokens first, in the order given.
`answer_rows` gives a pair the same bits whatever else the call holds: its product is elementwise and
its sum runs over the hidden size of that pair alone (`tests/integration/test_packed_decoder.py`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def flat_pairs(tokens: Sequence[Sequence[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(row index, token id) of every pair, flat, in TOKENS' order."""
    rows = torch.tensor([i for i, ids in enumerate(tokens) for _ in ids], dtype=torch.long)
    ids = torch.tensor([t for ids in tokens for t in ids], dtype=torch.long)
    return rows.to(device), ids.to(device)


def pick(logits: torch.Tensor, tokens: Sequence[Sequence[int]]) -> torch.Tensor:
    """LOGITS [R, V] at each row's TOKENS, flat [P]."""
    if len(tokens) != logits.shape[0]:
        raise ValueError(f"{logits.shape[0]} rows of logits for {len(tokens)} answer sets")
    rows, ids = flat_pairs(tokens, logits.device)
    return logits[rows, ids]


def answer_rows(hidden: torch.Tensor, weight: torch.Tensor, tokens: Sequence[Sequence[int]]) -> torch.Tensor:
    """HIDDEN [R, H] (each row's last hidden state, final-normed) against the output layer's
    WEIGHT [V, H] at each row's TOKENS only: flat [P], the logits `hidden @ weight.T` would hold
    there, without the other rows of WEIGHT."""
    if len(tokens) != hidden.shape[0]:
        raise ValueError(f"{hidden.shape[0]} hidden states for {len(tokens)} answer sets")
    vocab = weight.shape[0]
    if any(not 0 <= t < vocab for ids in tokens for t in ids):
        raise ValueError(f"an answer token is outside the vocabulary of {vocab}")
    rows, ids = flat_pairs(tokens, hidden.device)
    return torch.linalg.vecdot(hidden.index_select(0, rows), weight.index_select(0, ids))


__all__ = ["answer_rows", "flat_pairs", "pick"]
