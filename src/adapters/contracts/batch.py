"""One planned forward of the encoder family as a plain value: `Batch` in, per-row outputs out.

The encoder family builds one `Batch` from a planned forward's rows (`EncoderModel.run`) and hands
it to its engine in one call, `EncoderEngine.forward(batch)`, whatever the rows ask for:

- `Ask.EMBEDDING`: the row's pooled vector, with the model's pooling (normalized when configured):
  float32 [dimensions];
- `Ask.LOGITS`: the sequence-classification head's logits: float32 [labels] (the family has
  already cut a decoder score head's row at the token it reads);
- `Ask.TOKENS`: the last hidden state of every token of the row, computed with the row alone
  (padded reference forward), as a tensor [tokens, hidden] on the model's device in its dtype;
  the family's token heads (sparse, multi-vector, token classification) read it.

The rows' token ids are also given flat (`ids`), with the rows' cumulative `bounds` and the
token types (`type_ids`, None when every row's are 0), for an engine that feeds a runtime
flat arrays. `Batch.answer` is the grouping every engine of ours uses: each ask's rows through
one callable, in a fixed order (token rows, then heads, then pooled), the answers put back in
row order. No array or tensor library is imported here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property
from typing import Any

from vllm_srun.adapters.contracts.common import Encoded

__all__ = ["Ask", "Batch", "BatchOutputs", "RowsForward"]


class Ask(StrEnum):
    """What one row of a forward asks its engine for (module doc)."""

    EMBEDDING = "embedding"
    LOGITS = "logits"
    TOKENS = "tokens"


# The order `Batch.answer` runs the asks in (the family's order before the port: token rows, then
# head rows, then pooled rows).
ANSWER_ORDER = (Ask.TOKENS, Ask.LOGITS, Ask.EMBEDDING)

# One output per row, in row order: a float32 numpy row for EMBEDDING and LOGITS, a device tensor
# for TOKENS (module doc).
BatchOutputs = list[Any]

# An engine's forward over some rows of one ask: one output per row, in their order.
RowsForward = Callable[[Sequence[Encoded]], Iterable[Any]]


@dataclass(frozen=True)
class Batch:
    """The rows of one planned forward and what each asks (same length, row order kept)."""

    rows: tuple[Encoded, ...]
    asks: tuple[Ask, ...]

    def __post_init__(self) -> None:
        if len(self.rows) != len(self.asks):
            raise ValueError(f"a batch of {len(self.rows)} rows with {len(self.asks)} asks")
        if not self.rows:
            raise ValueError("empty batch")

    @classmethod
    def of(cls, rows: Sequence[Encoded], ask: Ask = Ask.EMBEDDING) -> Batch:
        """ROWS, every one asking ASK."""
        return cls(tuple(rows), (ask,) * len(rows))

    def __len__(self) -> int:
        return len(self.rows)

    @cached_property
    def ids(self) -> tuple[int, ...]:
        """Every row's token ids, back to back."""
        return tuple(token for row in self.rows for token in row.ids)

    @cached_property
    def bounds(self) -> tuple[int, ...]:
        """The rows' cumulative lengths: row i is `ids[bounds[i]:bounds[i + 1]]` (len(rows) + 1 values)."""
        out = [0]
        for row in self.rows:
            out.append(out[-1] + len(row.ids))
        return tuple(out)

    @cached_property
    def type_ids(self) -> tuple[int, ...] | None:
        """Every row's token types, back to back; None when they are all 0."""
        if not any(any(row.type_ids) for row in self.rows):
            return None
        return tuple(t for row in self.rows for t in row.type_ids)

    def asking(self, ask: Ask) -> list[int]:
        """The positions of the rows that ask ASK, in row order."""
        return [i for i, a in enumerate(self.asks) if a is ask]

    def answer(self, forwards: Mapping[Ask, RowsForward]) -> BatchOutputs:
        """Each ask's rows through FORWARDS[ask] (one call per ask present, `ANSWER_ORDER`), the
        outputs in row order. ValueError for an ask the engine has no forward for."""
        present = set(self.asks)
        if len(present) == 1:  # the common forward: one call over the rows as they are
            (ask,) = present
            return list(self._forward(forwards, ask)(self.rows))
        out: BatchOutputs = [None] * len(self.rows)
        for ask in ANSWER_ORDER:
            if ask not in present:
                continue
            where = self.asking(ask)
            for i, row in zip(where, self._forward(forwards, ask)([self.rows[i] for i in where]), strict=True):
                out[i] = row
        return out

    @staticmethod
    def _forward(forwards: Mapping[Ask, RowsForward], ask: Ask) -> RowsForward:
        forward = forwards.get(ask)
        if forward is None:
            raise ValueError(f"this engine has no forward for rows that ask {ask.value}")
        return forward
