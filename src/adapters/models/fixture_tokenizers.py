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

The kinds' writers are in `fixture_tokenizer_kinds.py`, what they share in
`fixture_tokenizer_parts.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from vllm_srun.adapters.models.fixture_tokenizer_kinds import byte_bpe, clip, siglip, unigram, wordpiece
from vllm_srun.adapters.models.fixture_tokenizer_parts import (
    BYTE_BPE_TYPES,
    DECODER_TYPES,
    MODEL_TYPES,
    UNIGRAM_TYPES,
    WORDPIECE_TYPES,
    TokenizerInfo,
)

__all__ = ["DECODER_TYPES", "MODEL_TYPES", "TokenizerInfo", "write_fixture_tokenizer"]


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


_WRITERS = {
    **dict.fromkeys(WORDPIECE_TYPES, wordpiece),
    **dict.fromkeys(BYTE_BPE_TYPES, byte_bpe),
    **dict.fromkeys(UNIGRAM_TYPES, unigram),
    "clip": clip,
    "siglip": siglip,
}
