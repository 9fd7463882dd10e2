"""Text → token ids with the `tokenizers` library, padding and truncation turned off (the batch
pads; nothing is ever cut silently).

`TextTokenizer.encode` / `encode_pairs` return one `Encoded` per input. With `max_length` set, an
input that is longer is either cut (`truncate=True`: the tokenizer's own truncation, so the special
tokens stay — `[CLS] … [SEP]`; pairs longest-first) and flagged `truncated=True`, or returned whole
(`truncate=False`) so the caller can see `n_tokens > max_length` and reject it. `n_tokens` is always
the full, uncut length (special tokens included); `len(ids)` is what the model will see.

`families/fixtures/wordpiece_fixture.py` builds the tiny BERT-style WordPiece tokenizers of the fixtures
and tests.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer

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
