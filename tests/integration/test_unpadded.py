"""The unpadded (packed) encoder forward gives the padded forward's answers, row by row."""

from __future__ import annotations

import random

import numpy as np
import torch

from vllm_srun.adapters.models.encoder_arch import eager_linears, hidden_states
from vllm_srun.adapters.models.reference_encoder import ReferenceEncoder
from vllm_srun.adapters.models.tokenization import TextTokenizer
from vllm_srun.adapters.models.unpadded import PackedRows, classify, pooled

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


def test_a_forward_padded_once_gives_the_bits_of_one_padded_per_linear(minilm_dir) -> None:  # type: ignore[no-untyped-def]
    from vllm_srun.adapters.engines.cpu_onednn import PackedEncoder, onednn_unsupported
    from vllm_srun.adapters.models.unpadded import LayerLinears
    from vllm_srun.domain.worker.kernels import bucket_rows

    reference = ReferenceEncoder.from_folder(minilm_dir)
    batch = TextTokenizer.from_folder(minilm_dir).encode(_texts(11, 4), max_length=256)
    answers = {}
    with torch.inference_mode():
        eager = eager_linears(reference.encoder)
        for pad_to in (None, bucket_rows, lambda n: n + 7):
            rows = PackedRows.build(batch, pad_to=pad_to)
            assert rows.tokens == sum(len(e.ids) for e in batch) and rows.rows_total >= rows.tokens
            answers[rows.rows_total] = pooled(hidden_states(reference.encoder, rows, eager), rows, reference.pooling)
        if onednn_unsupported("cpu", torch.float32) is None:
            encoder = PackedEncoder(reference.encoder, None)
            linears = [LayerLinears(x.qkv, x.attn_out, x.ffn_in, x.ffn_out) for x in encoder.layers]
            per_linear, once = (PackedRows.build(batch, pad_to=p) for p in (None, bucket_rows))
            assert once.rows_total == bucket_rows(once.tokens) > once.tokens  # the case this test is about
            a, b = (
                pooled(hidden_states(reference.encoder, r, linears), r, reference.pooling) for r in (per_linear, once)
            )
            assert torch.equal(a, b)
    first, *rest = answers.values()
    assert len(answers) == 3 and all((first - other).abs().max().item() < 1e-5 for other in rest)
