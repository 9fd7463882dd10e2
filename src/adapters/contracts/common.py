"""What several contracts share: progress lines, card fields, plugin cards, the tokenized row."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from vllm_srun.domain.ports import Clock

__all__ = ["CardFields", "Clock", "Encoded", "PluginCard", "Progress", "quiet"]

Progress = Callable[[str], None]

# Fields a plugin adds to a model's card (`/v1/models`): JSON values, read by nothing but the card.
CardFields = Mapping[str, object]


def quiet(_message: str) -> None:
    """A Progress that prints nothing."""


class PluginCard(Protocol):
    """What the card shows of an installed plugin (`adapters/plugins.PluginInfo`)."""

    def card(self) -> dict[str, str]:
        """`{group, name, distribution, version}`."""
        ...


@dataclass(frozen=True, slots=True)
class Encoded:
    """One tokenized row: ids and token-type ids (same length), whether it was cut, and its full
    length (special tokens included; `len(ids)` is what the model sees)."""

    ids: Sequence[int]
    type_ids: Sequence[int]
    truncated: bool
    n_tokens: int
