"""The unpadded (packed) encoder forward gives the padded forward's answers, row by row."""

from __future__ import annotations

import random

import numpy as np
import torch

from vllm_srun.adapters.models.reference_encoder import ReferenceEncoder
from vllm_srun.adapters.models.tokenization import TextTokenizer
from vllm_srun.adapters.models.unpadded import PackedRows, classify, eager_linears, hidden_states, pooled

WORDS = [
    "the",
    "model",
    "routes",
    "billing",
    "questions",
    "to",
    "a",
    "human",
    "agent",
    "when",
    "the",
    "answer",
    "is",
    "not",
    "clear",
]


def _texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 60))) for _ in range(n)]


def test_embeddings_equal_padded_forward_in_any_order(minilm_dir) -> None:  # type: ignore[no-untyped-def]
    reference = ReferenceEncoder.from_folder(minilm_dir)
    tok = TextTokenizer.from_folder(minilm_dir)
    batch = tok.encode(_texts(23, 1), max_length=256)
    assert len({len(e.ids) for e in batch}) > 5  # ragged
    with torch.inference_mode():
        packed = PackedRows.build(batch)
        ours = pooled(
            hidden_states(reference.encoder, packed, eager_linears(reference.encoder)), packed, reference.pooling
        ).numpy()
    padded = reference.embed(batch)
    alone = np.stack([reference.embed([e])[0] for e in batch])
    assert np.abs(ours - padded).max() < 1e-5
    assert np.abs(ours - alone).max() < 1e-5
    # the caller's order comes back, whatever the internal sort
    assert packed.order != list(range(len(batch)))


def test_classifier_logits_equal_padded_forward(encoder_fixture) -> None:  # type: ignore[no-untyped-def]
    folder = encoder_fixture("classify")
    reference = ReferenceEncoder.from_folder(folder)
    tok = TextTokenizer.from_folder(folder)
    batch = tok.encode_pairs([(a, b) for a, b in zip(_texts(9, 2), _texts(9, 3))], max_length=128, truncate=True)
    with torch.inference_mode():
        packed = PackedRows.build(batch)
        assert packed.types is not None
        logits = classify(
            hidden_states(reference.encoder, packed, eager_linears(reference.encoder)), packed, reference.head
        ).numpy()
    assert np.abs(logits - reference.classify_logits(batch)).max() < 1e-5


def test_one_length_batch_has_one_run() -> None:
    from vllm_srun.adapters.models.tokenization import Encoded

    rows = [Encoded((1, 2, 3), (0, 0, 0), False, 3)] * 4
    packed = PackedRows.build(rows)
    assert packed.runs == [(0, 4, 3, 0)] and packed.positions.tolist() == [0, 1, 2] * 4
