"""Pooling configuration and maths, the tokenizer wrapper (no padding, no silent cut), the tiny
WordPiece tokenizer writer."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from vllm_srun.adapters.families.fixtures.wordpiece_fixture import write_tiny_wordpiece_tokenizer
from vllm_srun.adapters.models.pooling import PoolingConfig, pool
from vllm_srun.adapters.models.st_modules import load_pooling_config
from vllm_srun.adapters.models.tokenization import Encoded, TextTokenizer

LONG = " ".join(f"word{i % 17} and, more" for i in range(120))  # about 600 tokens
MEDIUM = "The quick brown fox jumps over the lazy dog near the river bank in the morning."


# ---------------------------------------------------------------- pooling configuration


def test_minilm_pooling_config(minilm_dir: Path) -> None:
    cfg = load_pooling_config(minilm_dir)
    assert cfg == PoolingConfig(modes=("mean",), normalize=True, max_seq_length=256, from_sentence_transformers=True)


def test_defaults_without_sentence_transformers_files(tmp_path: Path) -> None:
    assert load_pooling_config(tmp_path) == PoolingConfig(modes=("mean",), normalize=False)
    assert load_pooling_config(tmp_path, default_mode="cls").modes == ("cls",)


def _write_st(folder: Path, pooling: dict, *, normalize: bool, path: str = "1_Pooling", max_len=None) -> None:
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": path, "type": "sentence_transformers.models.Pooling"},
    ]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (folder / path).mkdir(parents=True)
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / path / "config.json").write_text(json.dumps({"word_embedding_dimension": 8, **pooling}))
    if max_len is not None:
        (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_len}))


@pytest.mark.parametrize(
    "flags,modes",
    [
        ({"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}, ("cls",)),
        ({"pooling_mode_max_tokens": True}, ("max",)),
        ({"pooling_mode_mean_sqrt_len_tokens": True}, ("mean_sqrt_len",)),
        ({"pooling_mode_lasttoken": True}, ("lasttoken",)),
        ({"pooling_mode_weightedmean_tokens": True}, ("weightedmean",)),
        ({"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": True}, ("cls", "mean")),
        ({"pooling_mode": "lasttoken"}, ("lasttoken",)),
    ],
)
def test_reads_pooling_modes(tmp_path: Path, flags: dict, modes: tuple) -> None:
    _write_st(tmp_path, flags, normalize=False, path="pool_here", max_len=64)
    cfg = load_pooling_config(tmp_path)
    assert cfg.modes == modes and not cfg.normalize and cfg.max_seq_length == 64


def test_normalize_module_and_unknown_mode(tmp_path: Path) -> None:
    _write_st(tmp_path, {"pooling_mode_mean_tokens": True}, normalize=True)
    cfg = load_pooling_config(tmp_path)
    assert cfg.normalize and cfg.max_seq_length is None
    with pytest.raises(ValueError, match="pooling modes"):
        PoolingConfig(modes=("median",))


# ---------------------------------------------------------------- pooling maths


def _reference(mode: str, h: np.ndarray, m: np.ndarray) -> np.ndarray:
    out = []
    for row, mask in zip(h, m):
        real = row[mask.astype(bool)]
        if mode == "cls":
            out.append(row[0])
        elif mode == "lasttoken":
            out.append(row[np.nonzero(mask)[0][-1]])
        elif mode == "max":
            out.append(real.max(axis=0))
        elif mode == "mean":
            out.append(real.mean(axis=0))
        elif mode == "mean_sqrt_len":
            out.append(real.sum(axis=0) / np.sqrt(len(real)))
        elif mode == "weightedmean":
            w = (np.arange(1, len(mask) + 1) * mask)[:, None]
            out.append((row * w).sum(axis=0) / w.sum())
    return np.stack(out)


@pytest.mark.parametrize("mode", ["cls", "lasttoken", "max", "mean", "mean_sqrt_len", "weightedmean"])
def test_pool_matches_reference(mode: str) -> None:
    gen = torch.Generator().manual_seed(3)
    hidden = torch.randn(4, 7, 8, generator=gen) - 0.5  # negative values: masked max must ignore pads
    lengths = [7, 3, 1, 5]
    mask = (torch.arange(7)[None, :] < torch.tensor(lengths)[:, None]).long()
    hidden[mask == 0] = 50.0  # garbage in padded slots must never leak
    if mode == "cls":
        hidden[:, 0] = torch.randn(4, 8, generator=gen)
    got = pool(hidden, mask, PoolingConfig(modes=(mode,))).numpy()
    np.testing.assert_allclose(got, _reference(mode, hidden.numpy(), mask.numpy()), rtol=1e-5, atol=1e-5)
    full = torch.randn(3, 5, 8, generator=gen)
    no_mask = pool(full, None, PoolingConfig(modes=(mode,)))
    ones = pool(full, torch.ones(3, 5, dtype=torch.long), PoolingConfig(modes=(mode,)))
    torch.testing.assert_close(no_mask, ones, rtol=1e-6, atol=1e-6)


def test_lasttoken_left_padding_concat_and_normalize() -> None:
    hidden = torch.randn(2, 4, 6)
    left = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    got = pool(hidden, left, PoolingConfig(modes=("lasttoken",)))
    torch.testing.assert_close(got, hidden[:, -1])
    both = pool(hidden, left, PoolingConfig(modes=("cls", "mean"), normalize=True))
    assert both.shape == (2, 12)
    torch.testing.assert_close(both.norm(dim=1), torch.ones(2))
    raw = torch.cat([hidden[:, 0], pool(hidden, left, PoolingConfig(modes=("mean",)))], dim=1)
    torch.testing.assert_close(both, torch.nn.functional.normalize(raw, dim=1))


# ---------------------------------------------------------------- tokenization


@pytest.fixture(scope="module")
def tok(minilm_dir: Path) -> TextTokenizer:
    return TextTokenizer.from_folder(minilm_dir)


def test_no_padding_no_truncation_by_default(tok: TextTokenizer) -> None:
    # the shipped tokenizer.json enables padding and truncation at 128: both must be off here
    short, long = tok.encode(["Hello world", LONG])
    assert list(short.ids) == [101, 7592, 2088, 102] and list(short.type_ids) == [0, 0, 0, 0]
    assert not short.truncated and short.n_tokens == 4
    assert long.n_tokens == len(long.ids) > 512 and not long.truncated
    assert tok.num_special_tokens(False) == 2 and tok.num_special_tokens(True) == 3


def test_reject_mode_keeps_full_length(tok: TextTokenizer) -> None:
    full = tok.encode([LONG])[0]
    kept = tok.encode([LONG, "short"], max_length=32, truncate=False)
    assert kept[0] == full and not kept[0].truncated and kept[0].n_tokens > 32  # the caller rejects it
    assert kept[1].n_tokens < 32


def test_truncation_keeps_specials_and_reports_length(tok: TextTokenizer) -> None:
    full = tok.encode([LONG])[0]
    short = tok.encode(["tiny text"])[0]
    cut, same, again = tok.encode([LONG, "tiny text", LONG], max_length=32, truncate=True)
    assert cut.truncated and len(cut.ids) == 32 and cut.n_tokens == full.n_tokens
    assert cut.ids[0] == 101 and cut.ids[-1] == 102 and list(cut.ids[:31]) == list(full.ids[:31])
    assert list(cut.type_ids) == [0] * 32
    assert same == short and again == cut  # order kept; rows that fit are untouched
    assert len(tok.encode([LONG], max_length=20, truncate=True)[0].ids) == 20  # a new limit applies
    with pytest.raises(ValueError, match="no room"):
        tok.encode([LONG], max_length=2, truncate=True)


def test_pair_truncation_is_longest_first(tok: TextTokenizer) -> None:
    query = "what is the capital of france"
    (one,) = tok.encode_pairs([(LONG, query)], max_length=40, truncate=True)
    q_ids = tok.encode([query])[0].ids[1:-1]
    sep = list(one.ids).index(102)
    assert one.truncated and len(one.ids) == 40 and one.ids[-1] == 102
    assert list(one.ids[sep + 1 : -1]) == list(q_ids)  # the short side stays whole
    assert list(one.type_ids) == [0] * (sep + 1) + [1] * (40 - sep - 1)
    (both,) = tok.encode_pairs([(LONG, LONG)], max_length=41, truncate=True)
    first = list(both.ids).index(102)
    a_len, b_len = first - 1, len(both.ids) - first - 2
    assert abs(a_len - b_len) <= 1 and a_len + b_len == 38


def test_matches_transformers_tokenizer(tok: TextTokenizer, minilm_dir: Path) -> None:
    import transformers

    ref = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    texts = [MEDIUM, "Café naïve 東京 🙂 3.14", LONG]
    for ours, text in zip(tok.encode(texts, max_length=64, truncate=True), texts):
        want = ref(text, truncation=True, max_length=64)
        assert list(ours.ids) == want["input_ids"] and list(ours.type_ids) == want["token_type_ids"]
    pairs = [(LONG, MEDIUM), (MEDIUM, LONG), (LONG, LONG)]
    for ours, (a, b) in zip(tok.encode_pairs(pairs, max_length=50, truncate=True), pairs):
        want = ref(a, b, truncation="longest_first", max_length=50)
        assert list(ours.ids) == want["input_ids"] and list(ours.type_ids) == want["token_type_ids"]


def test_encoded_is_frozen() -> None:
    enc = Encoded(ids=[1, 2], type_ids=[0, 0], truncated=False, n_tokens=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        enc.n_tokens = 3  # type: ignore[misc]


def test_tiny_wordpiece_tokenizer(tmp_path: Path) -> None:
    vocab = write_tiny_wordpiece_tokenizer(tmp_path, ["hello", "world", "Paris"])
    assert vocab["[PAD]"] == 0 and vocab["[UNK]"] == 1 and vocab["[CLS]"] == 2 and vocab["[SEP]"] == 3
    assert (tmp_path / "vocab.txt").read_text().splitlines() == list(vocab)
    tiny = TextTokenizer.from_folder(tmp_path)
    (single,) = tiny.encode(["Hello PARIS, world ☃"])
    assert list(single.ids) == [2, vocab["hello"], vocab["paris"], vocab[","], vocab["world"], 1, 3]
    (pair,) = tiny.encode_pairs([("hello", "world xyz")])
    assert list(pair.ids) == [2, vocab["hello"], 3, vocab["world"], vocab["x"], vocab["##y"], vocab["##z"], 3]
    assert list(pair.type_ids) == [0, 0, 0, 1, 1, 1, 1, 1]
    import transformers

    ref = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert ref("hello", "world xyz")["input_ids"] == list(pair.ids)
