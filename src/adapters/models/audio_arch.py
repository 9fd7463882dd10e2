"""What the audio engine (`engines/native_audio.py`) reads of an audio family's network.

`AudioNetwork` is every attribute the engine reads; `AudioNetworkDefaults` gives the optional ones
their defaults (no text tower), so that the engine reads them plainly, never probing. Whisper's
encoder (`whisper.py`) has only an audio tower; CLAP (`clap.py`) has a text tower beside it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol, runtime_checkable

import torch
from torch import nn

__all__ = ["AudioNetwork", "AudioNetworkDefaults"]


@runtime_checkable
class AudioNetwork(Protocol):
    # the network embeds token id rows in its audio space (`embed_text`)
    has_text_tower: bool

    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]: ...  # nn.Module's

    def embed_audio(self, features: torch.Tensor) -> torch.Tensor:
        """[B, dimensions] for a batch of feature arrays [B, ...] (all of the model's window)."""
        ...

    def embed_text(self, rows: Sequence[Sequence[int]]) -> torch.Tensor:
        """[B, dimensions] for token id rows; only called where `has_text_tower`."""
        ...


class AudioNetworkDefaults:
    """The optional attributes of `AudioNetwork` at their defaults: every audio network derives
    from it (beside `nn.Module`) and overrides what it has."""

    has_text_tower: bool = False

    def embed_text(self, rows: Sequence[Sequence[int]]) -> torch.Tensor:
        raise ValueError("this audio model has no text tower")
