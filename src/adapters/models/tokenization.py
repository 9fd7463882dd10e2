"""Text → token ids with the `tokenizers` library, padding and truncation turned off (the batch
pads; nothing is ever cut silently).

`TextTokenizer.encode` / `encode_pairs` return one `Encoded` per input. With `max_length` set, an
input that is longer is either cut (`truncate=True`: the tokenizer's own truncation, so the special
tokens stay — `[CLS] … [SEP]`; pairs longest-first) and flagged `truncated=True`, or returned whole
(`truncate=False`) so the caller can see `n_tokens > max_length` and reject it. `n_tokens` is always
the full, uncut length (special tokens included); `len(ids)` is what the model will see.

`write_tiny_wordpiece_tokenizer` builds a small BERT-style WordPiece `tokenizer.json` in code, for
tiny random-weight models in tests and fixtures.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from vllm_srun.adapters.contracts import Encoded as Encoded  # the row type is the contracts'; kept importable here


class TextTokenizer:
    """A `tokenizers.Tokenizer` without padding or truncation, plus on-demand truncation."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        tokenizer.no_padding()
        tokenizer.no_truncation()
        self.tokenizer = tokenizer
        # a second copy does the cutting, so the main one never changes state under other threads
        self._cutter = Tokenizer.from_str(tokenizer.to_str())
        self._cutter_length: int | None = None
        self._cut_lock = threading.Lock()
        self._windowers: dict[tuple[int, int, bool], tuple[Tokenizer, threading.Lock]] = {}

    @classmethod
    def from_folder(cls, folder: Path) -> TextTokenizer:
        path = Path(folder) / "tokenizer.json"
        if not path.exists():
            raise FileNotFoundError(f"no tokenizer.json in {folder}")
        return cls(Tokenizer.from_file(str(path)))

    def num_special_tokens(self, pair: bool = False) -> int:
        """How many tokens the post-processor adds (BERT: 2 for one text, 3 for a pair)."""
        return self.tokenizer.num_special_tokens_to_add(pair)

    def token_id(self, token: str) -> int | None:
        return self.tokenizer.token_to_id(token)

    def encode(self, texts: Sequence[str], max_length: int | None = None, truncate: bool = False) -> list[Encoded]:
        return self._run(list(texts), max_length, truncate)

    def encode_pairs(
        self, pairs: Sequence[tuple[str, str]], max_length: int | None = None, truncate: bool = False
    ) -> list[Encoded]:
        return self._run([(a, b) for a, b in pairs], max_length, truncate)

    def _run(self, inputs: list, max_length: int | None, truncate: bool) -> list[Encoded]:
        if not inputs:
            return []
        encodings = self.tokenizer.encode_batch(inputs)
        out = [Encoded(ids, e.type_ids, False, len(ids)) for e in encodings for ids in (e.ids,)]
        if max_length is None or not truncate:
            return out
        long_rows = [i for i, e in enumerate(out) if e.n_tokens > max_length]
        if long_rows:
            pair = isinstance(inputs[0], tuple)
            if max_length <= self.num_special_tokens(pair) + int(pair):
                raise ValueError(f"max_length {max_length} leaves no room for text after the special tokens")
            cut = self._cut([inputs[i] for i in long_rows], max_length)
            for i, e in zip(long_rows, cut):
                out[i] = Encoded(e.ids, e.type_ids, True, out[i].n_tokens)
        return out

    windows_pairs = True  # `windowing(..., pair=True)` cuts the second text into windows

    def windowing(self, length: int, overlap: int, pair: bool) -> tuple[Tokenizer, threading.Lock]:
        """A copy that cuts inputs into overflow windows of LENGTH tokens sharing OVERLAP (a pair
        keeps its first text whole and slides over the second), with the lock that guards it.
        The 16 most recent settings are kept."""
        key = (length, overlap, pair)
        found = self._windowers.get(key)
        if found is None:
            if len(self._windowers) >= 16:
                self._windowers.pop(next(iter(self._windowers)))
            tok = Tokenizer.from_str(self.tokenizer.to_str())
            tok.no_padding()
            tok.enable_truncation(length, stride=overlap, strategy="only_second" if pair else "longest_first")
            found = self._windowers[key] = (tok, threading.Lock())
        return found

    def _cut(self, inputs: list, max_length: int) -> list:
        with self._cut_lock:
            if self._cutter_length != max_length:
                self._cutter.enable_truncation(max_length, strategy="longest_first")
                self._cutter_length = max_length
            return self._cutter.encode_batch(inputs)


SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def write_tiny_wordpiece_tokenizer(
    folder: Path, vocab_words: Iterable[str], *, lowercase: bool = True, model_max_length: int = 512
) -> dict[str, int]:
    """Write a BERT-style WordPiece tokenizer (tokenizer.json, vocab.txt, tokenizer_config.json,
    special_tokens_map.json) into FOLDER and return its vocabulary.

    Ids: [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4, then VOCAB_WORDS (lowercased when LOWERCASE), then
    the single letters, digits and ASCII punctuation and their `##` continuations, so that any ASCII text
    splits into known pieces. Post-processor: `[CLS] a [SEP]` and `[CLS] a [SEP] b [SEP]` (type id 1 for b
    and its [SEP]).
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab: dict[str, int] = {}
    pieces = "abcdefghijklmnopqrstuvwxyz0123456789" + "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
    words = [w.lower() if lowercase else w for w in vocab_words]
    for token in [*SPECIAL_TOKENS, *words, *pieces, *(f"##{c}" for c in pieces)]:
        vocab.setdefault(token, len(vocab))
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lowercase
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    tok.save(str(folder / "tokenizer.json"))
    (folder / "vocab.txt").write_text("".join(f"{t}\n" for t in vocab), encoding="utf-8")
    specials = {
        "unk_token": "[UNK]",
        "sep_token": "[SEP]",
        "pad_token": "[PAD]",
        "cls_token": "[CLS]",
        "mask_token": "[MASK]",
    }
    (folder / "special_tokens_map.json").write_text(json.dumps(specials, indent=2), encoding="utf-8")
    config = {
        **specials,
        "do_lower_case": lowercase,
        "tokenizer_class": "BertTokenizer",
        "model_max_length": model_max_length,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    return vocab
