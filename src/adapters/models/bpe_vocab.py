"""Building a small BPE vocabulary and merge list in code (the fixture tokenizers): byte-level
BPE's printable byte stand-ins, and `MergeBuilder`, which grows merges so that chosen words come
out as single tokens."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any

from tokenizers import models, pre_tokenizers


def byte_symbols(text: str) -> list[str]:
    """TEXT's UTF-8 bytes as byte-level BPE's printable stand-ins (GPT-2's alphabet), one per byte."""
    mapped = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False).pre_tokenize_str(text)
    return list("".join(piece for piece, _ in mapped))


def byte_alphabet() -> list[str]:
    """The 256 stand-ins in byte order (the printable bytes are themselves, the others follow U+00FF)."""
    return sorted(pre_tokenizers.ByteLevel.alphabet())


class MergeBuilder:
    """Grows a BPE vocabulary and merge list so that chosen words come out as single tokens.

    Each word is first split with the merges so far (lowest rank first, leftmost on ties, as BPE
    applies them); then merges joining the resulting pieces left to right are appended. Later
    merges rank after every earlier one, so words added before still come out whole."""

    def __init__(self, alphabet: Iterable[str]) -> None:
        self.tokens: list[str] = list(dict.fromkeys(alphabet))
        self._known = set(self.tokens)
        self.merges: list[tuple[str, str]] = []
        self._rank: dict[tuple[str, str], int] = {}

    def split(self, symbols: Sequence[str]) -> list[str]:
        pieces = list(symbols)
        while len(pieces) > 1:
            ranked = [(self._rank.get((a, b)), i) for i, (a, b) in enumerate(itertools.pairwise(pieces))]
            found = [(r, i) for r, i in ranked if r is not None]
            if not found:
                break
            _, i = min(found)
            pieces[i : i + 2] = [pieces[i] + pieces[i + 1]]
        return pieces

    def add(self, symbols: Sequence[str]) -> None:
        pieces = self.split(symbols)
        while len(pieces) > 1:
            pair = (pieces[0], pieces[1])
            self._rank[pair] = len(self.merges)
            self.merges.append(pair)
            joined = pieces[0] + pieces[1]
            if joined not in self._known:
                self._known.add(joined)
                self.tokens.append(joined)
            pieces = [joined, *pieces[2:]]

    def model(self, head: Sequence[str], tail: Sequence[str] = (), **options: Any) -> tuple[dict[str, int], models.BPE]:
        """The vocabulary (HEAD, the tokens built, TAIL; a repeated token keeps its first id) and the BPE
        model of it and the merges (no dropout, no subword prefix, no fused unknowns; OPTIONS add to them)."""
        vocab: dict[str, int] = {}
        for token in [*head, *self.tokens, *tail]:
            vocab.setdefault(token, len(vocab))
        bpe = models.BPE(vocab, self.merges, dropout=None, continuing_subword_prefix="", fuse_unk=False, **options)
        return vocab, bpe
