"""Our torch BERT encoder against the `transformers` reference (test-only dependency).

1. all-MiniLM-L6-v2 embeddings (mean pooling + L2 normalize) within 1e-5, row alone and in
   shuffled mixed-length batches; the published cos-similarity example.
2. Tiny random `BertForSequenceClassification` / `RobertaForSequenceClassification` checkpoints
   written with `save_pretrained`: logits within 1e-5 for texts and text pairs.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from vllm_srun.adapters.models.bert import BertConfig, BertEncoder, load_bert
from vllm_srun.adapters.models.reference_encoder import ReferenceEncoder
from vllm_srun.adapters.models.tokenization import Encoded, TextTokenizer
from vllm_srun.adapters.models.weights import WeightsError

TOL = 1e-5

FIXED = [
    "A man is eating food.",
    "Hi",
    "?",
    "Café, naïve façade — déjà vu!",
    "東京は日本の首都です。",
    "Γειά σου κόσμε, Привет мир, مرحبا بالعالم",
    "Emoji test 🙂🚀 with symbols: #hashtag @user $100 & 50% off!!!",
    "Numbers: 3.14159, 42,000, 1e-9, -17 and 2024-11-30T08:00:00Z.",
    "https://example.com/path?q=a+b&x=1 is a URL; so is ftp://host/file.txt",
    "   leading and trailing spaces   ",
    "ALL CAPS SENTENCE WITH MIXED case Words",
    "tabs\tand\nnewlines\r\nin text",
    "\"Quoted\" 'single' (parens) [brackets] {braces} <angles>",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
]
WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "he",
    "this",
    "are",
    "or",
    "his",
    "from",
    "at",
    "which",
    "but",
    "have",
    "an",
    "they",
    "you",
    "were",
    "her",
    "she",
    "there",
    "been",
    "one",
    "all",
    "we",
    "their",
    "has",
    "would",
    "when",
    "if",
    "so",
    "no",
    "out",
    "up",
    "into",
    "do",
    "only",
    "time",
    "two",
    "may",
    "then",
    "first",
    "any",
    "new",
    "some",
    "could",
    "these",
    "people",
    "other",
    "than",
    "year",
    "over",
    "such",
    "make",
    "like",
    "model",
    "token",
    "serving",
    "batch",
    "query",
    "embedding",
    "vector",
    "latency",
    "throughput",
    "kernel",
    "memory",
    "river",
    "mountain",
]


def _sentences() -> list[str]:
    rnd = random.Random(1234)
    out = list(FIXED)
    for i in range(40):
        n = 1 + int(220 * (i / 39) ** 3)  # lengths from 1 to 221 words, mostly short ones
        words = []
        for _ in range(n):
            w = rnd.choice(WORDS)
            r = rnd.random()
            if r < 0.08:
                w = str(rnd.randint(0, 99999))
            elif r < 0.14:
                w += rnd.choice(",.;:!?")
            elif r < 0.17:
                w = w.capitalize() + "'s"
            words.append(w)
        out.append(" ".join(words))
    return out


SENTENCES = _sentences()


@pytest.fixture(scope="module")
def minilm(minilm_dir: Path):
    reference = ReferenceEncoder.from_folder(minilm_dir)
    tok = TextTokenizer.from_folder(minilm_dir)
    ref = transformers.AutoModel.from_pretrained(minilm_dir, attn_implementation="eager").eval()
    return reference, tok, ref


def _reference_embedding(ref, enc: Encoded) -> np.ndarray:
    """sentence-transformers' mean pooling + L2 normalize, on one unpadded row."""
    with torch.no_grad():
        hidden = ref(input_ids=torch.tensor([list(enc.ids)])).last_hidden_state[0]
        mean = hidden.mean(dim=0)
        return torch.nn.functional.normalize(mean, dim=0).numpy()


def test_minilm_embeddings_match_transformers_alone_and_batched(minilm) -> None:
    reference, tok, ref = minilm
    assert len(SENTENCES) >= 50
    encoded = tok.encode(SENTENCES, max_length=reference.pooling.max_seq_length, truncate=True)
    lengths = sorted(len(e.ids) for e in encoded)
    assert lengths[0] <= 3 and lengths[-1] == 256 and any(e.truncated for e in encoded)
    expected = np.stack([_reference_embedding(ref, e) for e in encoded])
    alone = np.concatenate([reference.embed([e]) for e in encoded])
    assert alone.dtype == np.float32 and alone.shape == (len(SENTENCES), 384)
    assert np.abs(alone - expected).max() < TOL

    order = list(range(len(encoded)))
    random.Random(7).shuffle(order)
    for size in (7, 50):
        for start in range(0, len(order), size):
            idx = order[start : start + size]
            got = reference.embed([encoded[i] for i in idx])
            assert np.abs(got - expected[idx]).max() < TOL, f"batch of {len(idx)} rows at {start}"
    # pairwise distinct: the comparison above is not between near-constant vectors
    sims = expected @ expected.T
    assert sims[~np.eye(len(sims), dtype=bool)].max() < 0.999


def test_minilm_hidden_states_match_for_padded_pairs(minilm) -> None:
    reference, tok, ref = minilm
    pairs = [
        ("What is the capital of France?", "Paris is the capital and largest city of France."),
        ("short", "a much longer second segment, with punctuation; numbers 12 34 and more words"),
    ]
    enc = tok.encode_pairs(pairs)
    assert all(any(e.type_ids) for e in enc)
    t = max(len(e.ids) for e in enc)
    ids = torch.tensor([list(e.ids) + [0] * (t - len(e.ids)) for e in enc])
    types = torch.tensor([list(e.type_ids) + [0] * (t - len(e.ids)) for e in enc])
    mask = torch.tensor([[1] * len(e.ids) + [0] * (t - len(e.ids)) for e in enc])
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        got = reference.encoder(ids, mask, types)
        got_no_types = reference.encoder(ids, mask, None)
    valid = mask.bool()
    assert (got - want)[valid].abs().max() < TOL
    assert (got_no_types - want)[valid].abs().max() > 1e-3  # token types really matter


def test_minilm_published_similarity(minilm) -> None:
    reference, tok, _ = minilm
    a, b = reference.embed(tok.encode(["A man is eating food.", "A man is eating a piece of bread."]))
    assert np.linalg.norm(a) == pytest.approx(1.0, abs=1e-5)
    assert float(a @ b) == pytest.approx(0.755, abs=0.01)


TEXTS = [
    "the quick brown fox jumps over the lazy dog",
    "good movie",
    "terrible plot, bad actor!!",
    "a",
    "Paris is the capital city of France and 123 other facts",
    "unknown ∑ unicode ☃ here",
]
PAIRS = [
    ("what is the capital of france", "paris is the capital of france"),
    ("query", "a long relevant document about a river in a large city with small birds"),
    ("the cat", "the dog"),
    ("question about fish", "answer"),
]


def _reference_logits(model, encoded: list[Encoded]) -> np.ndarray:
    t = max(len(e.ids) for e in encoded)
    pad = lambda seq: list(seq) + [0] * (t - len(seq))  # noqa: E731
    with torch.no_grad():
        kwargs = {}
        if model.config.type_vocab_size > 1:
            kwargs["token_type_ids"] = torch.tensor([pad(e.type_ids) for e in encoded])
        return model(
            input_ids=torch.tensor([pad(e.ids) for e in encoded]),
            attention_mask=torch.tensor([pad([1] * len(e.ids)) for e in encoded]),
            **kwargs,
        ).logits.numpy()


@pytest.mark.parametrize("num_labels,hidden_act", [(3, "gelu"), (1, "gelu"), (3, "gelu_new"), (2, "relu")])
def test_tiny_bert_classifier_matches_transformers(tiny_classifier_factory, num_labels, hidden_act) -> None:
    folder = tiny_classifier_factory(num_labels, hidden_act=hidden_act)
    ref = transformers.BertForSequenceClassification.from_pretrained(folder, attn_implementation="eager").eval()
    reference = ReferenceEncoder.from_folder(folder)
    tok = TextTokenizer.from_folder(folder)
    assert reference.has_classifier and reference.pooling.modes == ("cls",)  # no ST files: cls default
    assert reference.labels == [f"label_{chr(97 + i)}" for i in range(num_labels)]
    for encoded in (tok.encode(TEXTS), tok.encode_pairs(PAIRS)):
        want = _reference_logits(ref, encoded)
        assert want.std() > 1e-2  # a real signal, not a constant
        got = reference.classify_logits(encoded)
        assert got.dtype == np.float32 and got.shape == (len(encoded), num_labels)
        assert np.abs(got - want).max() < TOL
        alone = np.concatenate([reference.classify_logits([e]) for e in encoded])
        assert np.abs(alone - want).max() < TOL


def test_tiny_roberta_classifier_matches_transformers(tiny_classifier_factory) -> None:
    folder = tiny_classifier_factory(2, model_type="roberta")
    ref = transformers.RobertaForSequenceClassification.from_pretrained(folder, attn_implementation="eager").eval()
    reference = ReferenceEncoder.from_folder(folder)
    assert reference.config.position_offset == 1 and reference.config.max_tokens == 129
    encoded = TextTokenizer.from_folder(folder).encode(TEXTS[:5])  # ASCII only: no [UNK] (id 1)
    want = _reference_logits(ref, encoded)
    assert np.abs(reference.classify_logits(encoded) - want).max() < TOL


def test_config_parsing(tiny_classifier_factory) -> None:
    folder = tiny_classifier_factory(4, problem_type="multi_label_classification")
    cfg = BertConfig.from_folder(folder)
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.intermediate_size) == (32, 2, 4, 64)
    assert cfg.num_labels == 4 and cfg.id2label[3] == "label_d" and cfg.problem_type == "multi_label_classification"
    assert BertConfig.from_dict({"model_type": "bert"}).labels == ["LABEL_0", "LABEL_1"]
    with pytest.raises(ValueError, match="hidden_act"):
        BertConfig.from_dict({"hidden_act": "mish"})
    with pytest.raises(ValueError, match="model_type"):
        BertConfig.from_dict({"model_type": "llama"})


def test_missing_tensor_is_named_and_buffers_are_skipped(tiny_classifier_factory, minilm_dir: Path) -> None:
    folder = tiny_classifier_factory(2)
    tensors = load_file(str(folder / "model.safetensors"))
    assert any(k.startswith("bert.") for k in tensors)  # the prefixed layout loads (other tests)
    del tensors["bert.encoder.layer.1.attention.self.key.bias"]
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(WeightsError, match=r"encoder\.layer\.1\.attention\.self\.key\.bias"):
        load_bert(folder)
    # all-MiniLM: no prefix, an int64 position_ids buffer, no head
    encoder, head = load_bert(minilm_dir)
    assert isinstance(encoder, BertEncoder) and head is None


def test_runner_rejects_bad_batches(minilm) -> None:
    reference, tok, _ = minilm
    with pytest.raises(ValueError, match="empty"):
        reference.embed([])
    with pytest.raises(ValueError, match="no sequence-classification head"):
        reference.classify_logits(tok.encode(["x"]))
    too_long = tok.encode(["word " * 600], max_length=256, truncate=False)
    assert too_long[0].n_tokens > 512 and not too_long[0].truncated
    with pytest.raises(ValueError, match="exceeds"):
        reference.embed(too_long)
