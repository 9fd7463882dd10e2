"""Fixture tokenizers of the real kinds (`families/fixtures/fixture_tokenizers.py`) give the ids that
transformers' own tokenizer class for the model type gives — singles, pairs, token types, special
tokens written in the text — on varied text; their vocabulary files (vocab.txt, vocab.json +
merges.txt, SentencePiece models) say the same as tokenizer.json; WORDS are whole tokens."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import transformers

from vllm_srun.adapters.families.fixtures.fixture_tokenizers import (
    DECODER_TYPES,
    MODEL_TYPES,
    TokenizerInfo,
    write_fixture_tokenizer,
)
from vllm_srun.adapters.models.tokenization import TextTokenizer

WORDS = ["the", "a", "of", "cat", "dog", "query", "passage", "photo", "hello", "world", "café", "Paris"]
TEXTS = [
    "a photo of a cat",
    "The quick brown fox jumps over the lazy dog.",
    "Hello, World! HELLO world? hello-world",
    "naïve café résumé — Ångström, über, niño, façade, Straße",
    "decomposed: cafe\u0301 e\u0301le\u0300ve A\u030angstro\u0308m",
    "東京タワーと富士山 北京欢迎你 서울 العربية Ελληνικά",
    "emoji 😀🎉 👍🏽 family 👨‍👩‍👧 ❤️",
    "numbers 12345 and 3.14159, 1,000,000 and 2024-06-01 ½ ² ①",
    "punct!!! (b) [s] {c} <a> \"q\" 's' #h @a $d %p ^c &a *s _u ~t `t` |p\\b/s ...?!",
    "  leading and trailing spaces   ",
    "tabs\tand\nnewlines\r\nmixed   runs  of   spaces\u00a0nbsp\u3000ideographic",
    "UPPER CASE WORDS AND MiXeD CaSe",
    "don't won't it's we're I've you'll they'd",
    "yes no Yes No YES NO",
    "▁already ▁ marked",
    "query: what is the capital of France? passage: Paris is the capital.",
    "a",
    "",
    "   ",
    "x" * 120,
]
# transformers reads an empty second text as no second text at all, so pairs hold no empty text
PAIRS = [(a, b) for a, b in zip(TEXTS, TEXTS[1:] + TEXTS[:1]) if a and b]
# files each kind ships besides tokenizer.json, tokenizer_config.json and special_tokens_map.json
VOCAB_FILES = {
    "bert": ["vocab.txt"],
    "distilbert": ["vocab.txt"],
    "mpnet": ["vocab.txt"],
    "roberta": ["vocab.json", "merges.txt"],
    "qwen2": ["vocab.json", "merges.txt"],
    "qwen3": ["vocab.json", "merges.txt"],
    "qwen3_5": ["vocab.json", "merges.txt"],
    "clip": ["vocab.json", "merges.txt"],
    "xlm-roberta": ["sentencepiece.bpe.model"],
    "deberta-v2": ["spm.model"],
    "siglip": ["spiece.model"],
    "modernbert": [],
    "llama": [],
}
CLASSES = {
    "bert": "BertTokenizer",
    "distilbert": "DistilBertTokenizer",
    "mpnet": "MPNetTokenizer",
    "roberta": "RobertaTokenizer",
    "modernbert": "TokenizersBackend",
    "qwen2": "Qwen2Tokenizer",
    "qwen3": "Qwen2Tokenizer",
    "qwen3_5": "Qwen3_5Tokenizer",  # whatever tokenizer_config.json says (Qwen2Tokenizer, as the Hub's)
    "llama": "TokenizersBackend",
    "xlm-roberta": "XLMRobertaTokenizer",
    "deberta-v2": "DebertaV2Tokenizer",
    "clip": "CLIPTokenizer",
    "siglip": "SiglipTokenizer",
}


def _package(folder: Path, model_type: str, **options: Any) -> TokenizerInfo:
    info = write_fixture_tokenizer(folder, model_type, WORDS, model_max_length=64, **options)
    (folder / "config.json").write_text(json.dumps({"model_type": model_type}), encoding="utf-8")
    return info


def _reference(folder: Path, **kwargs: Any) -> Any:
    transformers.logging.set_verbosity_error()
    return transformers.AutoTokenizer.from_pretrained(folder, **kwargs)


def _assert_same_ids(folder: Path, reference: Any, texts: list[str], pairs: list[tuple[str, str]]) -> None:
    ours = TextTokenizer.from_folder(folder)
    for text, row in zip(texts, ours.encode(texts)):
        assert list(row.ids) == reference(text)["input_ids"], text
    for pair, row in zip(pairs, ours.encode_pairs(pairs)):
        want = reference(*pair)
        assert list(row.ids) == want["input_ids"], pair
        if "token_type_ids" in want:
            assert list(row.type_ids) == want["token_type_ids"], pair


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_transformers_class_gives_our_ids(tmp_path: Path, model_type: str) -> None:
    info = _package(tmp_path, model_type)
    reference = _reference(tmp_path)
    assert type(reference).__name__ == CLASSES[model_type]
    _assert_same_ids(tmp_path, reference, TEXTS, PAIRS)
    assert info.vocab_size == len(reference) < 1000
    assert info.pad_token_id == reference.pad_token_id
    assert info.unk_token_id == reference.unk_token_id
    assert info.mask_token_id == reference.mask_token_id
    if reference.cls_token is not None:
        assert (info.cls_token_id, info.sep_token_id) == (reference.cls_token_id, reference.sep_token_id)
    assert info.bos_token_id == (reference.cls_token_id if reference.cls_token is not None else reference.bos_token_id)
    for role, token in info.special_tokens.items():
        assert str(getattr(reference, role)) == token
        assert reference.convert_tokens_to_ids(token) == info.token_ids[token]
    # transformers 5 has no slow classes left for these: use_fast=False reads the same files the same way
    _assert_same_ids(tmp_path, _reference(tmp_path, use_fast=False), TEXTS[:8], PAIRS[:4])


@pytest.mark.parametrize("model_type", [t for t in MODEL_TYPES if t != "siglip"])
def test_special_tokens_written_in_the_text(tmp_path: Path, model_type: str) -> None:
    info = _package(tmp_path, model_type)
    specials = sorted(set(info.token_ids) - {"yes", "no"})
    texts = [
        form.format(t) for t in specials for form in ("foo {0} bar", "{0}x", "x {0}", "{0} {0}", "A{0}  b", "{0}, b")
    ]
    _assert_same_ids(tmp_path, _reference(tmp_path), texts, [(f"a {t} b", f"{t}c") for t in specials])


def test_siglip_special_tokens_written_in_the_text(tmp_path: Path) -> None:
    """SiglipTokenizer adds `▁` once, before the text: a stretch after a special token written in
    the text has none (Metaspace's `first`). Not mirrored: its `</s>` is not added again when the
    text already ends in `</s>`, and a stretch after a written special token that starts with
    punctuation and a space loses its `▁`."""
    _package(tmp_path, "siglip")
    texts = ["foo </s> bar", "</s>x", "a <unk> b", "foo</s>bar", "<unk>b, c", "A</s>  b"]
    _assert_same_ids(tmp_path, _reference(tmp_path), texts, [("a </s> b", "</s>c")])


def test_tokenizers_read_as_they_are_have_the_published_pipelines(tmp_path: Path) -> None:
    """ModernBERT and Llama-3 packages are PreTrainedTokenizerFast ones: transformers reads their
    tokenizer.json whole, so agreeing with it proves nothing about the pipeline; it must be the
    published one (answerdotai/ModernBERT-base: GPT-NeoX's; meta-llama/Meta-Llama-3-8B)."""
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    _package(tmp_path / "modernbert", "modernbert")
    spec = json.loads((tmp_path / "modernbert" / "tokenizer.json").read_text(encoding="utf-8"))
    assert spec["normalizer"] == {"type": "NFC"}
    assert spec["pre_tokenizer"] == byte_level
    assert spec["model"]["type"] == "BPE" and spec["model"]["ignore_merges"] is False
    ids = [t["id"] for t in spec["added_tokens"]]
    assert [t["content"] for t in spec["added_tokens"]] == ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
    assert ids == list(range(ids[0], ids[0] + 5)) and ids[0] == len(spec["model"]["vocab"])
    llama_regex = (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
        r"|\s+(?!\S)|\s+"
    )
    _package(tmp_path / "llama", "llama")
    spec = json.loads((tmp_path / "llama" / "tokenizer.json").read_text(encoding="utf-8"))
    assert spec["normalizer"] is None
    split, level = spec["pre_tokenizer"]["pretokenizers"]
    assert split == {"type": "Split", "pattern": {"Regex": llama_regex}, "behavior": "Isolated", "invert": False}
    assert level == {**byte_level, "use_regex": False}
    assert spec["model"]["ignore_merges"] is True
    post = spec["post_processor"]["processors"]
    assert post[0] == {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}
    assert [next(iter(p)) for p in post[1]["single"]] == ["SpecialToken", "Sequence"]
    ours = TextTokenizer.from_folder(tmp_path / "llama").tokenizer
    assert ours.encode("1234567", add_special_tokens=False).tokens == ["12", "3", "45", "6", "7"]


# Qwen3_5Tokenizer (transformers 5.25) does not build itself from vocab.json + merges.txt: without
# tokenizer.json it tokenizes every text to nothing. Qwen3.5's packages all ship tokenizer.json.
@pytest.mark.parametrize("model_type", [t for t, files in VOCAB_FILES.items() if files and t != "qwen3_5"])
def test_the_vocabulary_files_alone_give_the_same_ids(tmp_path: Path, model_type: str) -> None:
    """Without tokenizer.json, the class builds itself from vocab.txt / vocab.json + merges.txt /
    the SentencePiece model (as transformers 4.x slow classes read them) and still agrees."""
    source, bare = tmp_path / "full", tmp_path / "bare"
    _package(source, model_type)
    for name in ("config.json", "tokenizer_config.json", "special_tokens_map.json", *VOCAB_FILES[model_type]):
        bare.mkdir(exist_ok=True)
        shutil.copy(source / name, bare / name)
    reference = _reference(bare)
    ours = TextTokenizer.from_folder(source)
    for text, row in zip(TEXTS, ours.encode(TEXTS)):
        assert list(row.ids) == reference(text)["input_ids"], text


def test_bert_python_wordpiece_reads_vocab_txt_alike(tmp_path: Path) -> None:
    from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

    _package(tmp_path, "bert")
    _assert_same_ids(tmp_path, BertTokenizerLegacy.from_pretrained(tmp_path), TEXTS, PAIRS)


@pytest.mark.parametrize("model_type", ["xlm-roberta", "deberta-v2", "siglip"])
def test_sentencepiece_models_hold_our_pieces(tmp_path: Path, model_type: str) -> None:
    """The .model files load in sentencepiece; their pieces are tokenizer.json's (XLM-R's in
    fairseq order: <unk> <s> </s>, then every piece one id below ours)."""
    import sentencepiece

    _package(tmp_path, model_type)
    processor = sentencepiece.SentencePieceProcessor(model_file=str(tmp_path / VOCAB_FILES[model_type][0]))
    vocab = json.loads((tmp_path / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    if model_type == "xlm-roberta":
        assert pieces[:3] == ["<unk>", "<s>", "</s>"]
        assert pieces[3:] == [p for p, _ in vocab[4:-1]]
    else:
        assert pieces == [p for p, _ in vocab[: len(pieces)]]
    # the trainer spec's special ids name pieces of the right types (2 unknown, 3 control)
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto.FromString((tmp_path / VOCAB_FILES[model_type][0]).read_bytes())
    spec = proto.trainer_spec
    assert (spec.model_type, spec.byte_fallback, spec.vocab_size) == (1, False, len(pieces))
    assert proto.pieces[spec.unk_id].type == 2 and proto.pieces[spec.unk_id].piece == spec.unk_piece
    for role_id, role_piece in (
        (spec.bos_id, spec.bos_piece),
        (spec.eos_id, spec.eos_piece),
        (spec.pad_id, spec.pad_piece),
    ):
        assert role_id < 0 or (proto.pieces[role_id].type == 3 and proto.pieces[role_id].piece == role_piece)
    assert [p.type for p in proto.pieces].count(2) == 1
    assert processor.encode("a photo of a cat", out_type=str) == ["▁a", "▁photo", "▁of", "▁a", "▁cat"]


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_words_are_whole_tokens_and_the_writer_is_deterministic(tmp_path: Path, model_type: str) -> None:
    info = _package(tmp_path / "a", model_type)
    _package(tmp_path / "b", model_type)
    assert {p.name: p.read_bytes() for p in (tmp_path / "a").iterdir()} == {
        p.name: p.read_bytes() for p in (tmp_path / "b").iterdir()
    }
    ours = TextTokenizer.from_folder(tmp_path / "a").tokenizer
    for word in WORDS:
        alone = ours.encode(word, add_special_tokens=False)
        assert len(alone.ids) == 1, (word, alone.tokens)
        in_text = ours.encode(f"the {word}", add_special_tokens=False)
        assert len(in_text.ids) == 2, (word, in_text.tokens)
        # what the model looks up: the word as the normalizer leaves it (BERT's drops accents, CLIP's lowercases)
        normalized = ours.normalizer.normalize_str(word) if ours.normalizer is not None else word
        assert ours.decode(alone.ids).replace("</w>", "").strip() == normalized
    if model_type in DECODER_TYPES:
        for word in ("yes", "no"):
            assert ours.encode(word, add_special_tokens=False).ids == [info.token_ids[word]]


@pytest.mark.parametrize("model_type", DECODER_TYPES)
def test_add_eos_closes_every_text(tmp_path: Path, model_type: str) -> None:
    """Qwen3-Embedding style: the post-processor appends the end-of-text token (off by default)."""
    plain = _package(tmp_path / "plain", model_type)
    closing = _package(tmp_path / "eos", model_type, add_eos=True)
    assert closing.eos_token_id == plain.eos_token_id
    ids = TextTokenizer.from_folder(tmp_path / "eos").encode(["hello world"])[0].ids
    assert ids[-1] == closing.eos_token_id
    assert TextTokenizer.from_folder(tmp_path / "plain").encode(["hello world"])[0].ids[-1] != plain.eos_token_id
    _assert_same_ids(tmp_path / "eos", _reference(tmp_path / "eos"), TEXTS, PAIRS)


@pytest.mark.parametrize("variant", ["clip", "siglip"])
def test_multimodal_fixture_tokenizer_agrees_with_its_model_config(tmp_path: Path, variant: str) -> None:
    from vllm_srun.adapters.families.fixtures.multimodal_fixture import write_multimodal_fixture

    write_multimodal_fixture(tmp_path, variant, seed=0)  # the tokenizer and config.json it ships
    reference = _reference(tmp_path)
    _assert_same_ids(tmp_path, reference, TEXTS, [])
    text = transformers.AutoConfig.from_pretrained(tmp_path).text_config
    assert (text.vocab_size, text.pad_token_id, text.eos_token_id) == (
        len(reference),
        reference.pad_token_id,
        reference.eos_token_id,
    )


def test_configs_we_cannot_write_are_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"model_type 'gpt2' has no fixture tokenizer"):
        write_fixture_tokenizer(tmp_path, "gpt2", WORDS, model_max_length=8)
    with pytest.raises(ValueError, match=r"add_eos applies to qwen2, qwen3, qwen3_5, llama"):
        write_fixture_tokenizer(tmp_path, "bert", WORDS, model_max_length=8, add_eos=True)
    with pytest.raises(ValueError, match=r"no whitespace \(got 'new york'\)"):
        write_fixture_tokenizer(tmp_path, "roberta", ["new york"], model_max_length=8)
