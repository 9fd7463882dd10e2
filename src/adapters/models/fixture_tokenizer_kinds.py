"""The fixture tokenizer of each kind (`fixture_tokenizers.py` picks one by model type): WordPiece
(`bert`, `distilbert`, `mpnet`), byte-level BPE (`roberta`, `modernbert`, `qwen2`, `qwen3`,
`qwen3_5`, `llama`; `clip` with its `</w>` word ends) and SentencePiece Unigram (`xlm-roberta`,
`deberta-v2`, `siglip`), each building tokenizer.json with the pipeline its transformers class
builds."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from vllm_srun.adapters.models.bpe_vocab import MergeBuilder, byte_alphabet, byte_symbols
from vllm_srun.adapters.models.fixture_tokenizer_parts import (
    ACCENTED,
    ASCII_PIECES,
    CLIP_PATTERN,
    DECODER_TYPES,
    DIGITS,
    LLAMA3_PATTERN,
    QWEN3_5_PATTERN,
    QWEN_PATTERN,
    QWEN_TYPES,
    ROBERTA_ROLES,
    SIGLIP_PUNCTUATION,
    SPACE,
    TokenizerInfo,
    as_normalized,
    finish,
    special_token,
    write_json,
)
from vllm_srun.adapters.models.sentencepiece_file import sentencepiece_model

# ---------------------------------------------------------------- WordPiece (bert, distilbert, mpnet)


def wordpiece(folder: Path, kind: str, words: list[str], model_max_length: int, add_eos: bool) -> TokenizerInfo:
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
    for token in [*head, *as_normalized(words, normalizer), *singles, *(f"##{c}" for c in singles), *tail]:
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
    added = [special_token(t, lstrip=kind == "mpnet" and t == "<mask>") for t in sorted(named, key=vocab.__getitem__)]
    classes = {"bert": "BertTokenizer", "distilbert": "DistilBertTokenizer", "mpnet": "MPNetTokenizer"}
    config = {
        "tokenizer_class": classes[kind],
        "do_lower_case": True,
        "tokenize_chinese_chars": True,
        "strip_accents": None,
        "clean_up_tokenization_spaces": True,
    }
    return finish(folder, tok, added, roles, config, model_max_length)


# ---------------------------------------------------------------- byte-level BPE


def byte_bpe(folder: Path, kind: str, words: list[str], model_max_length: int, add_eos: bool) -> TokenizerInfo:
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
    for word in as_normalized(words, nfc):
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
    added = [special_token(t, lstrip=t in ("<mask>", "[MASK]")) for t in specials]
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
    return finish(folder, tok, added, roles, config, model_max_length, extra_ids=extra)


def _write_bpe_files(folder: Path, vocab: Mapping[str, int], merges: Sequence[tuple[str, str]]) -> None:
    write_json(folder / "vocab.json", dict(vocab))
    lines = "".join(f"{a} {b}\n" for a, b in merges)
    (folder / "merges.txt").write_text(f"#version: 0.2\n{lines}", encoding="utf-8")


def clip(folder: Path, kind: str, words: list[str], model_max_length: int, add_eos: bool) -> TokenizerInfo:
    """CLIPTokenizer's pipeline: NFC, whitespace runs to one space, lowercase; CLIP's word regex
    (whitespace dropped), byte-level; BPE whose word-final pieces end in `</w>`.
    <|startoftext|> = 0, <|endoftext|> = 1 (also pad and unknown), `<|startoftext|> A <|endoftext|>`."""
    bos, eos = "<|startoftext|>", "<|endoftext|>"
    normalizer = normalizers.Sequence(
        [normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Lowercase()]
    )
    alphabet = byte_alphabet()
    builder = MergeBuilder([*alphabet, *(f"{c}</w>" for c in alphabet)])
    for word in as_normalized(words, normalizer):
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
    return finish(
        folder, tok, [special_token(bos, normalized=True), special_token(eos)], roles, config, model_max_length
    )


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


def unigram(folder: Path, kind: str, words: list[str], model_max_length: int, add_eos: bool) -> TokenizerInfo:
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
    pieces = _unigram_pieces(as_normalized(words, normalizer), lowercase=False)
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
        added = [special_token(t, lstrip=t == "<mask>") for t in ("<s>", "<pad>", "</s>", "<unk>", "<mask>")]
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
        added = [special_token(t) for t in ("[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]")]
        config = {
            "tokenizer_class": "DebertaV2Tokenizer",
            "do_lower_case": False,
            "split_by_punct": False,
            "vocab_type": "spm",
        }
    return finish(folder, tok, added, roles, config, model_max_length)


def siglip(folder: Path, kind: str, words: list[str], model_max_length: int, add_eos: bool) -> TokenizerInfo:
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
    pieces = _unigram_pieces(as_normalized(words, normalizer), lowercase=True)
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
    added = [special_token(t, lstrip=True, rstrip=True) for t in ("</s>", "<unk>")]
    config = {"tokenizer_class": "SiglipTokenizer", "do_lower_case": True, "sp_model_kwargs": {}}
    return finish(folder, tok, added, roles, config, model_max_length)
