"""Tokenizers of the real kinds for tiny fixture packages, built in code.

`write_fixture_tokenizer(folder, model_type, words, model_max_length=…)` writes what a published
package of that `model_type` ships — `tokenizer.json`, `tokenizer_config.json`,
`special_tokens_map.json` and the vocabulary files its `transformers` class reads (`vocab.txt`,
`vocab.json` + `merges.txt`, or a SentencePiece `.model`) — with a small vocabulary that holds
WORDS as whole tokens and covers any text (a byte-level alphabet, or an unknown token).

transformers 5.x classes do not trust `tokenizer.json` whole: `BertTokenizer`, `MPNetTokenizer`,
`RobertaTokenizer`, `XLMRobertaTokenizer`, `DebertaV2Tokenizer`, `Qwen2Tokenizer` and
`CLIPTokenizer` take only its vocabulary (and merges, and the post-processor for Qwen) and rebuild
the normalizer, pre-tokenizer, model options and (except Qwen) the post-processor themselves.
Each writer here builds `tokenizer.json` with exactly the pipeline its class builds, so the class
and `tokenizers.Tokenizer.from_file` give the same ids. ModernBERT and Llama-3 ship
`PreTrainedTokenizerFast` packages, which read `tokenizer.json` as it is; SigLIP's class is a slow
SentencePiece one (it lowercases and drops ASCII punctuation first), mirrored by the normalizer
and Metaspace; two of its ways with special tokens written inside the text are not expressible in
tokenizer.json: it adds no `</s>` to a text that already ends in one, and a stretch after such a
token that starts with punctuation and a space loses its `▁`.

Kinds: WordPiece (`bert`, `distilbert`, `mpnet`), byte-level BPE (`roberta`, `modernbert`,
`qwen2`, `qwen3`, `qwen3_5`, `llama`, and `clip` with its `</w>` word ends), SentencePiece
Unigram with `▁` (`xlm-roberta`, `deberta-v2`, `siglip`). Qwen3.5's packages declare
`Qwen2Tokenizer` as the Hub's do; transformers reads a `qwen3_5` package with `Qwen3_5Tokenizer`
(its split regex keeps combining marks with their letters), which `qwen3_5` here mirrors.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from vllm_srun.adapters.models.bpe_vocab import MergeBuilder, byte_alphabet, byte_symbols
from vllm_srun.adapters.models.sentencepiece_file import sentencepiece_model

WORDPIECE_TYPES = ("bert", "distilbert", "mpnet")
BYTE_BPE_TYPES = ("roberta", "modernbert", "qwen2", "qwen3", "qwen3_5", "llama")
UNIGRAM_TYPES = ("xlm-roberta", "deberta-v2")
MULTIMODAL_TYPES = ("clip", "siglip")
MODEL_TYPES = WORDPIECE_TYPES + BYTE_BPE_TYPES + UNIGRAM_TYPES + MULTIMODAL_TYPES
DECODER_TYPES = ("qwen2", "qwen3", "qwen3_5", "llama")
QWEN_TYPES = ("qwen2", "qwen3", "qwen3_5")

# single characters every WordPiece / Unigram vocabulary holds (ASCII, then a few accented letters)
ASCII_PIECES = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789" + "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
ACCENTED = "àáâäãåçèéêëìíîïñòóôöõùúûüýÿæœß"
DIGITS = "0123456789"
SPACE = "▁"  # SentencePiece's word-start mark
# Qwen2's and Llama-3's pre-tokenizer regexes (Llama-3 groups digits by up to three)
QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen3.5's (`Qwen3_5Tokenizer`): combining marks (\p{M}) stay with the letters before them
QWEN3_5_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
CLIP_PATTERN = r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""
# what SigLIP's tokenizer strips before SentencePiece sees the text: Python's string.punctuation
SIGLIP_PUNCTUATION = r"[!-/:-@\[-`{-~]"
# special-token roles of RoBERTa's and XLM-RoBERTa's vocabularies (MPNet's, but for its unknown token)
ROBERTA_ROLES: Mapping[str, str] = {
    "bos_token": "<s>",
    "eos_token": "</s>",
    "unk_token": "<unk>",
    "sep_token": "</s>",
    "pad_token": "<pad>",
    "cls_token": "<s>",
    "mask_token": "<mask>",
}


@dataclass(frozen=True, slots=True)
class TokenizerInfo:
    """What a model config needs from the tokenizer: the embedding table's size and the special ids.

    `bos_token_id` is the token that opens a row (BERT's [CLS], RoBERTa's <s>, Llama's
    <|begin_of_text|>; None for Qwen), `eos_token_id` the one that closes it ([SEP], </s>,
    <|endoftext|>). `special_tokens` is special_tokens_map.json (role → string), `token_ids` maps
    every special string (and the decoder types' "yes"/"no") to its id."""

    vocab_size: int
    pad_token_id: int
    bos_token_id: int | None
    eos_token_id: int | None
    unk_token_id: int | None
    mask_token_id: int | None
    special_tokens: Mapping[str, str] = field(default_factory=dict)
    token_ids: Mapping[str, int] = field(default_factory=dict)

    @property
    def cls_token_id(self) -> int | None:
        return self._role("cls_token", self.bos_token_id)

    @property
    def sep_token_id(self) -> int | None:
        return self._role("sep_token", self.eos_token_id)

    def _role(self, role: str, default: int | None) -> int | None:
        token = self.special_tokens.get(role)
        return self.token_ids[token] if token is not None else default


def write_fixture_tokenizer(
    folder: Path, model_type: str, words: Sequence[str], *, model_max_length: int, add_eos: bool = False
) -> TokenizerInfo:
    """Write MODEL_TYPE's kind of tokenizer into FOLDER with WORDS as whole tokens (decoder types
    also get "yes" and "no"). ADD_EOS (qwen2, qwen3, llama): the post-processor closes every text
    with the end-of-text token, as Qwen3-Embedding's does."""
    kind = model_type.lower()
    if kind not in MODEL_TYPES:
        raise ValueError(f"model_type {model_type!r} has no fixture tokenizer (we write {', '.join(MODEL_TYPES)})")
    if add_eos and kind not in DECODER_TYPES:
        raise ValueError(f"add_eos applies to {', '.join(DECODER_TYPES)} tokenizers only (model_type {model_type!r})")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    spaced = [w for w in words if not w or any(c.isspace() for c in w)]
    if spaced:
        raise ValueError(f"fixture words must be non-empty and hold no whitespace (got {spaced[0]!r})")
    words = list(dict.fromkeys(words))
    if kind in DECODER_TYPES:
        words += [w for w in ("yes", "no") if w not in words]
    writer = _WRITERS[kind]
    return writer(folder, kind, words, model_max_length, add_eos)


# ---------------------------------------------------------------- shared pieces


def _special(content: str, *, lstrip: bool = False, rstrip: bool = False, normalized: bool = False) -> AddedToken:
    return AddedToken(content, single_word=False, lstrip=lstrip, rstrip=rstrip, normalized=normalized, special=True)


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _finish(
    folder: Path,
    tok: Tokenizer,
    added: Sequence[AddedToken],
    roles: Mapping[str, str | None],
    config: Mapping[str, Any],
    model_max_length: int,
    extra_ids: Iterable[str] = (),
) -> TokenizerInfo:
    """Register ADDED (in order: new ones get the next ids), save tokenizer.json,
    tokenizer_config.json (its added_tokens_decoder the same tokens with the same flags) and
    special_tokens_map.json; ROLES maps bos_token, eos_token, … to strings (None: the role is
    unset)."""
    tok.add_special_tokens(list(added))
    tok.save(str(folder / "tokenizer.json"))
    ids = {t.content: _id(tok, t.content) for t in added}
    ids.update({w: _id(tok, w) for w in extra_ids})
    decoder = {
        str(ids[t.content]): {
            "content": t.content,
            "lstrip": t.lstrip,
            "normalized": t.normalized,
            "rstrip": t.rstrip,
            "single_word": t.single_word,
            "special": t.special,
        }
        for t in sorted(added, key=lambda t: ids[t.content])
    }
    named = {role: token for role, token in roles.items() if token is not None}
    _write_json(folder / "special_tokens_map.json", named)
    _write_json(
        folder / "tokenizer_config.json",
        {"added_tokens_decoder": decoder, **roles, **config, "model_max_length": model_max_length},
    )

    def role_id(*names: str) -> int | None:
        for name in names:
            if roles.get(name) is not None:
                return ids[roles[name]]  # type: ignore[index]
        return None

    pad = role_id("pad_token", "eos_token")
    if pad is None:
        raise ValueError("a fixture tokenizer needs a pad or end-of-text token")
    return TokenizerInfo(
        vocab_size=tok.get_vocab_size(with_added_tokens=True),
        pad_token_id=pad,
        bos_token_id=role_id("cls_token", "bos_token"),
        eos_token_id=role_id("sep_token", "eos_token"),
        unk_token_id=role_id("unk_token"),
        mask_token_id=role_id("mask_token"),
        special_tokens=named,
        token_ids=ids,
    )


def _as_normalized(words: Iterable[str], normalizer: normalizers.Normalizer | None) -> list[str]:
    """WORDS as the tokenizer's normalizer leaves them (BERT's drops accents, CLIP's and SigLIP's
    lowercase …), so the vocabulary holds what the model will look up."""
    out = [normalizer.normalize_str(w) if normalizer is not None else w for w in words]
    return list(dict.fromkeys(w for w in out if w))


def _id(tok: Tokenizer, token: str) -> int:
    found = tok.token_to_id(token)
    if found is None:
        raise ValueError(f"token {token!r} is missing from the fixture vocabulary")
    return found


# ---------------------------------------------------------------- WordPiece (bert, distilbert, mpnet)


def _wordpiece(folder: Path, kind: str, words: list[str], model_max_length: int, add_eos: bool) -> TokenizerInfo:
    """BertTokenizer / DistilBertTokenizer / MPNetTokenizer: lowercasing BertNormalizer (accents
    stripped), BertPreTokenizer, WordPiece with `##` continuations. BERT: [PAD] [UNK] [CLS] [SEP]
    [MASK] = 0…4, `[CLS] A [SEP] B [SEP]` (type id 1 for B). MPNet (as all-mpnet-base-v2):
    <s> <pad> </s> <unk> [UNK] = 0…4, unknown token [UNK], <mask> last, `<s> A </s></s> B </s>`."""
    if kind == "mpnet":
        head = ["<s>", "<pad>", "</s>", "<unk>", "[UNK]"]
        roles = {**ROBERTA_ROLES, "unk_token": "[UNK]"}
        tail = ["<mask>"]
    else:
        head = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        roles = {
            "unk_token": "[UNK]",
            "sep_token": "[SEP]",
            "pad_token": "[PAD]",
            "cls_token": "[CLS]",
            "mask_token": "[MASK]",
        }
        tail = []
    normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True
    )
    vocab: dict[str, int] = {}
    singles = [c for c in ASCII_PIECES if not c.isupper()]  # the normalizer lowercases
    for token in [*head, *_as_normalized(words, normalizer), *singles, *(f"##{c}" for c in singles), *tail]:
        vocab.setdefault(token, len(vocab))
    unk = roles["unk_token"]
    tok = Tokenizer(models.WordPiece(vocab, unk_token=unk, max_input_chars_per_word=100))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    cls, sep = roles["cls_token"], roles["sep_token"]
    if kind == "mpnet":
        tok.post_processor = processors.RobertaProcessing((sep, vocab[sep]), (cls, vocab[cls]), True, False)
    else:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{cls}:0 $A:0 {sep}:0",
            pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
            special_tokens=[(cls, vocab[cls]), (sep, vocab[sep])],
        )
    tok.decoder = decoders.WordPiece(prefix="##")
    (folder / "vocab.txt").write_text("".join(f"{t}\n" for t in vocab), encoding="utf-8")
    named = list(dict.fromkeys(roles.values()))
    added = [_special(t, lstrip=kind == "mpnet" and t == "<mask>") for t in sorted(named, key=vocab.__getitem__)]
    classes = {"bert": "BertTokenizer", "distilbert": "DistilBertTokenizer", "mpnet": "MPNetTokenizer"}
    config = {
        "tokenizer_class": classes[kind],
        "do_lower_case": True,
        "tokenize_chinese_chars": True,
        "strip_accents": None,
        "clean_up_tokenization_spaces": True,
    }
    return _finish(folder, tok, added, roles, config, model_max_length)


# ---------------------------------------------------------------- byte-level BPE


def _byte_bpe(folder: Path, kind: str, words: list[str], model_max_length: int, add_eos: bool) -> TokenizerInfo:
    """Byte-level BPE: every byte is a token, WORDS (bare and after a space) and two-digit numbers
    are merged whole.

    roberta: RobertaTokenizer's pipeline (ByteLevel pre-tokenizer, `<s> A </s></s> B </s>`),
    <s> <pad> </s> <unk> = 0…3, <mask> last. modernbert (PreTrainedTokenizerFast, as
    answerdotai/ModernBERT-base): NFC, ByteLevel, `[CLS] A [SEP] B [SEP]`, [UNK] [CLS] [SEP] [PAD]
    [MASK] after the BPE tokens. qwen2/qwen3: Qwen2Tokenizer's pipeline (NFC, Qwen's split regex),
    <|endoftext|> <|im_start|> <|im_end|> after the BPE tokens, no special tokens added unless
    ADD_EOS. llama (Llama-3, PreTrainedTokenizerFast): Llama-3's split regex, merges ignored for
    whole-vocabulary words, `<|begin_of_text|> A` (and `<|end_of_text|>` last with ADD_EOS)."""
    nfc = normalizers.NFC() if kind in ("modernbert", *QWEN_TYPES) else None
    builder = MergeBuilder(byte_alphabet())
    for word in _as_normalized(words, nfc):
        for variant in (word, f" {word}"):
            builder.add(byte_symbols(variant))
    for pair in (f"{a}{b}" for a in DIGITS for b in DIGITS):  # numbers, so digit grouping shows (Qwen splits them)
        builder.add(byte_symbols(pair))
    # RoBERTa's specials are vocabulary entries (<mask> the last); the others' are added tokens only,
    # after the BPE vocabulary (as the published packages' vocab.json / tokenizer.json have them)
    head, tail = (["<s>", "<pad>", "</s>", "<unk>"], ["<mask>"]) if kind == "roberta" else ([], [])
    # Llama-3 takes a word the vocabulary holds whole (merges ignored)
    vocab, bpe = builder.model(head, tail, end_of_word_suffix="", byte_fallback=False, ignore_merges=kind == "llama")
    specials = {
        "roberta": ["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
        "modernbert": ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"],
        "llama": ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
    }.get(kind, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    ids = {t: vocab.get(t, len(vocab) + i) for i, t in enumerate(specials)}
    tok = Tokenizer(bpe)
    tok.decoder = decoders.ByteLevel()
    added = [_special(t, lstrip=t in ("<mask>", "[MASK]")) for t in specials]
    roles: dict[str, str | None]
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast"}
    if kind == "roberta":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.post_processor = processors.RobertaProcessing(("</s>", ids["</s>"]), ("<s>", ids["<s>"]), True, False)
        roles = dict(ROBERTA_ROLES)
        config = {"tokenizer_class": "RobertaTokenizer", "errors": "replace", "add_prefix_space": False}
        _write_bpe_files(folder, vocab, builder.merges)
    elif kind == "modernbert":
        tok.normalizer = nfc
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS]:0 $A:0 [SEP]:0",
            pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
            special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])],
        )
        roles = {
            "cls_token": "[CLS]",
            "sep_token": "[SEP]",
            "pad_token": "[PAD]",
            "mask_token": "[MASK]",
            "unk_token": "[UNK]",
        }
        config["model_input_names"] = ["input_ids", "attention_mask"]
    elif kind == "llama":
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
            ]
        )
        bot, eot = "<|begin_of_text|>", "<|end_of_text|>"
        close_a, close_b = (f" {eot}:0", f" {eot}:1") if add_eos else ("", "")
        template = processors.TemplateProcessing(
            single=f"{bot}:0 $A:0{close_a}",
            pair=f"{bot}:0 $A:0{close_a} {bot}:1 $B:1{close_b}",
            special_tokens=[(bot, ids[bot]), (eot, ids[eot])],
        )
        tok.post_processor = processors.Sequence(
            [processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True), template]
        )
        roles = {"bos_token": bot, "eos_token": eot, "pad_token": eot}
        config["model_input_names"] = ["input_ids", "attention_mask"]
    else:  # qwen2, qwen3, qwen3_5
        tok.normalizer = nfc
        pattern = QWEN3_5_PATTERN if kind == "qwen3_5" else QWEN_PATTERN
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        eot = "<|endoftext|>"
        if add_eos:  # Qwen2Tokenizer keeps tokenizer.json's post-processor
            tok.post_processor = processors.TemplateProcessing(
                single=f"$A:0 {eot}:0", pair=f"$A:0 {eot}:0 $B:1 {eot}:1", special_tokens=[(eot, ids[eot])]
            )
        else:
            tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
        roles = {"bos_token": None, "eos_token": eot, "pad_token": eot, "unk_token": None}
        config = {  # Qwen3.5's published packages say Qwen2Tokenizer too (transformers reads them as Qwen3.5's)
            "tokenizer_class": "Qwen2Tokenizer",
            "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
            "errors": "replace",
            "split_special_tokens": False,
        }
        _write_bpe_files(folder, vocab, builder.merges)
    config.setdefault("clean_up_tokenization_spaces", kind not in QWEN_TYPES)
    extra = [w for w in ("yes", "no") if w in words] if kind in DECODER_TYPES else []
    return _finish(folder, tok, added, roles, config, model_max_length, extra_ids=extra)


def _write_bpe_files(folder: Path, vocab: Mapping[str, int], merges: Sequence[tuple[str, str]]) -> None:
    _write_json(folder / "vocab.json", dict(vocab))
    lines = "".join(f"{a} {b}\n" for a, b in merges)
    (folder / "merges.txt").write_text(f"#version: 0.2\n{lines}", encoding="utf-8")


def _clip(folder: Path, kind: str, words: list[str], model_max_length: int, add_eos: bool) -> TokenizerInfo:
    """CLIPTokenizer's pipeline: NFC, whitespace runs to one space, lowercase; CLIP's word regex
    (whitespace dropped), byte-level; BPE whose word-final pieces end in `</w>`.
    <|startoftext|> = 0, <|endoftext|> = 1 (also pad and unknown), `<|startoftext|> A <|endoftext|>`."""
    bos, eos = "<|startoftext|>", "<|endoftext|>"
    normalizer = normalizers.Sequence(
        [normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Lowercase()]
    )
    alphabet = byte_alphabet()
    builder = MergeBuilder([*alphabet, *(f"{c}</w>" for c in alphabet)])
    for word in _as_normalized(words, normalizer):
        symbols = byte_symbols(word)
        builder.add([*symbols[:-1], f"{symbols[-1]}</w>"])
    vocab, bpe = builder.model([bos, eos], end_of_word_suffix="</w>", unk_token=eos)
    tok = Tokenizer(bpe)
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(CLIP_PATTERN), behavior="removed", invert=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    tok.post_processor = processors.RobertaProcessing((eos, vocab[eos]), (bos, vocab[bos]), False, False)
    tok.decoder = decoders.ByteLevel()
    _write_bpe_files(folder, vocab, builder.merges)
    roles = {"bos_token": bos, "eos_token": eos, "unk_token": eos, "pad_token": eos}
    config = {"tokenizer_class": "CLIPTokenizer", "errors": "replace", "do_lower_case": True}
    return _finish(folder, tok, [_special(bos, normalized=True), _special(eos)], roles, config, model_max_length)


# ---------------------------------------------------------------- SentencePiece Unigram


def _unigram_pieces(words: Sequence[str], *, lowercase: bool) -> list[tuple[str, float]]:
    """Normal pieces and their log-probabilities: `▁`, WORDS (normalized already) after `▁` and
    bare, then single characters after `▁` and bare (lowercase ones only with LOWERCASE). Whole
    words score far above spelling them out; every score is distinct, so no segmentation is a tie."""
    seen: dict[str, float] = {}

    def put(piece: str, score: float) -> None:
        if piece not in seen:
            seen[piece] = round(score - 1e-4 * len(seen), 6)

    put(SPACE, -4.0)
    for word in words:
        put(SPACE + word, -3.0)
        put(word, -5.0)
    singles = [c for c in ASCII_PIECES + ACCENTED if not (lowercase and c.isupper())]
    for c in singles:
        put(SPACE + c, -8.0)
    for c in singles:
        put(c, -9.0)
    return list(seen.items())


def _unigram(folder: Path, kind: str, words: list[str], model_max_length: int, add_eos: bool) -> TokenizerInfo:
    """SentencePiece Unigram (no byte fallback: what the vocabulary lacks is the unknown token).

    xlm-roberta: XLMRobertaTokenizer's pipeline (whitespace split, `▁` before every word), ids
    <s> <pad> </s> <unk> = 0…3, <mask> last, `<s> A </s></s> B </s>`; sentencepiece.bpe.model in
    fairseq order (<unk> <s> </s>, the rest one id lower). deberta-v2: DebertaV2Tokenizer's (\\s runs
    and tabs/newlines to one space, NFC, right strip, `▁` prepended), [PAD] [CLS] [SEP] [UNK] =
    0…3, [MASK] last, `[CLS] A [SEP] B [SEP]` (type id 1 for B); spm.model the same ids."""
    deberta_normalizer = normalizers.Sequence(
        [
            normalizers.Replace(Regex(r"\s{2,}|[\n\r\t]"), " "),
            normalizers.NFC(),
            normalizers.Strip(left=False, right=True),
        ]
    )
    normalizer = deberta_normalizer if kind == "deberta-v2" else None
    pieces = _unigram_pieces(_as_normalized(words, normalizer), lowercase=False)
    if kind == "xlm-roberta":
        vocab = [("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), *pieces, ("<mask>", 0.0)]
        tok = Tokenizer(models.Unigram(vocab, unk_id=3, byte_fallback=False))
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="always")]
        )
        tok.decoder = decoders.Metaspace(replacement=SPACE, prepend_scheme="always")
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
        )
        spm = [("<unk>", 0.0, 2), ("<s>", 0.0, 3), ("</s>", 0.0, 3), *((p, s, 1) for p, s in pieces)]
        model = sentencepiece_model(spm, unk=0, bos=1, eos=2, pad=-1, names=("<unk>", "<s>", "</s>", "<pad>"))
        (folder / "sentencepiece.bpe.model").write_bytes(model)
        roles: dict[str, str | None] = dict(ROBERTA_ROLES)
        added = [_special(t, lstrip=t == "<mask>") for t in ("<s>", "<pad>", "</s>", "<unk>", "<mask>")]
        config: dict[str, Any] = {"tokenizer_class": "XLMRobertaTokenizer", "clean_up_tokenization_spaces": True}
    else:  # deberta-v2
        head = [("[PAD]", 0.0), ("[CLS]", 0.0), ("[SEP]", 0.0), ("[UNK]", 0.0)]
        vocab = [*head, *pieces, ("[MASK]", 0.0)]
        tok = Tokenizer(models.Unigram(vocab, unk_id=3, byte_fallback=False))
        tok.normalizer = deberta_normalizer
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="always")]
        )
        tok.decoder = decoders.Metaspace(replacement=SPACE, prepend_scheme="always")
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS]:0 $A:0 [SEP]:0",
            pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
            special_tokens=[("[CLS]", 1), ("[SEP]", 2)],
        )
        spm = [(p, s, 3) for p, s in head[:3]] + [("[UNK]", 0.0, 2), *((p, s, 1) for p, s in pieces)]
        model = sentencepiece_model(spm, unk=3, bos=1, eos=2, pad=0, names=("[UNK]", "[CLS]", "[SEP]", "[PAD]"))
        (folder / "spm.model").write_bytes(model)
        roles = {
            "bos_token": "[CLS]",
            "eos_token": "[SEP]",
            "unk_token": "[UNK]",
            "sep_token": "[SEP]",
            "pad_token": "[PAD]",
            "cls_token": "[CLS]",
            "mask_token": "[MASK]",
        }
        added = [_special(t) for t in ("[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]")]
        config = {
            "tokenizer_class": "DebertaV2Tokenizer",
            "do_lower_case": False,
            "split_by_punct": False,
            "vocab_type": "spm",
        }
    return _finish(folder, tok, added, roles, config, model_max_length)


def _siglip(folder: Path, kind: str, words: list[str], model_max_length: int, add_eos: bool) -> TokenizerInfo:
    """SiglipTokenizer (slow, SentencePiece): it prefixes `▁`, lowercases, drops ASCII punctuation,
    folds whitespace runs to one space and strips, then SentencePiece splits the words; the
    normalizer does the same in that order. <pad> = 0, </s> = 1 (also the pad token), <unk> = 2;
    `A </s>`; spiece.model holds the same pieces and ids."""
    normalizer = normalizers.Sequence(
        [
            normalizers.Replace(SPACE, " "),
            normalizers.Lowercase(),
            normalizers.Replace(Regex(SIGLIP_PUNCTUATION), ""),
            normalizers.Replace(Regex(r"\s+"), " "),
            normalizers.Strip(left=False, right=True),
            normalizers.Replace(" ", SPACE),
            # the class's `▁` prefix keeps a leading space: `▁▁word` (Metaspace adds none before a `▁`)
            normalizers.Replace(Regex(f"\\A{SPACE}"), SPACE * 2),
        ]
    )
    pieces = _unigram_pieces(_as_normalized(words, normalizer), lowercase=True)
    specials = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    tok = Tokenizer(models.Unigram([*specials, *pieces], unk_id=2, byte_fallback=False))
    tok.normalizer = normalizer
    # `▁` before the text's start only, not after a special token inside it (as the class)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="first")
    tok.decoder = decoders.Metaspace(replacement=SPACE, prepend_scheme="always")
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", 1)]
    )
    spm = [("<pad>", 0.0, 3), ("</s>", 0.0, 3), ("<unk>", 0.0, 2), *((p, s, 1) for p, s in pieces)]
    model = sentencepiece_model(spm, unk=2, bos=-1, eos=1, pad=0, names=("<unk>", "<s>", "</s>", "<pad>"))
    (folder / "spiece.model").write_bytes(model)
    roles = {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "</s>"}
    added = [_special(t, lstrip=True, rstrip=True) for t in ("</s>", "<unk>")]
    config = {"tokenizer_class": "SiglipTokenizer", "do_lower_case": True, "sp_model_kwargs": {}}
    return _finish(folder, tok, added, roles, config, model_max_length)


_WRITERS = {
    **dict.fromkeys(WORDPIECE_TYPES, _wordpiece),
    **dict.fromkeys(BYTE_BPE_TYPES, _byte_bpe),
    **dict.fromkeys(UNIGRAM_TYPES, _unigram),
    "clip": _clip,
    "siglip": _siglip,
}
