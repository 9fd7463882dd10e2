"""What the fixture tokenizer writers share (`fixture_tokenizers.py` is the entry point): the model
types of each kind, the pre-tokenizer patterns and special-token roles, `TokenizerInfo`, and
`finish`, which registers the special tokens and saves tokenizer.json, tokenizer_config.json and
special_tokens_map.json."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer, normalizers

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


def special_token(content: str, *, lstrip: bool = False, rstrip: bool = False, normalized: bool = False) -> AddedToken:
    return AddedToken(content, single_word=False, lstrip=lstrip, rstrip=rstrip, normalized=normalized, special=True)


def write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def finish(
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
    ids = {t.content: token_id(tok, t.content) for t in added}
    ids.update({w: token_id(tok, w) for w in extra_ids})
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
    write_json(folder / "special_tokens_map.json", named)
    write_json(
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


def as_normalized(words: Iterable[str], normalizer: normalizers.Normalizer | None) -> list[str]:
    """WORDS as the tokenizer's normalizer leaves them (BERT's drops accents, CLIP's and SigLIP's
    lowercase …), so the vocabulary holds what the model will look up."""
    out = [normalizer.normalize_str(w) if normalizer is not None else w for w in words]
    return list(dict.fromkeys(w for w in out if w))


def token_id(tok: Tokenizer, token: str) -> int:
    found = tok.token_to_id(token)
    if found is None:
        raise ValueError(f"token {token!r} is missing from the fixture vocabulary")
    return found
