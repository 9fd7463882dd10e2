"""Sentence pooling as sentence-transformers configures it, and the pooling maths.

`PoolingConfig`: the pooling modes (cls, max, mean, mean_sqrt_len, weightedmean, lasttoken;
several concatenate their results in the order given), the modules that follow pooling (`steps`:
Dense, LayerNorm, a Normalize that is not the last module — `st_modules.py` reads them), whether
the result is L2-normalized at the end (a trailing Normalize module) and the package's
`max_seq_length`. `st_modules.load_pooling_config(folder)` reads it from a package; without
sentence-transformers files: `cls` pooling for a model with a classification head
(`default_mode="cls"`), `mean` otherwise, no normalization.

`pool(hidden, mask, cfg)` = `finish(pool_tokens(hidden, mask, cfg), cfg)`: the one function both
the padded forward (`ReferenceEncoder`, the ONNX export) and the unpadded one (`unpadded.pooled`,
per run of equal-length rows) call, so every module after pooling applies identically on both.
It takes right- or left-padded rows; `mask` None means every row is full.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

MODES = ("cls", "max", "mean", "mean_sqrt_len", "weightedmean", "lasttoken")


class PooledStep(Protocol):
    """A module after pooling: [B, D] → [B, width(D)]."""

    name: str

    def width(self, d: int) -> int: ...

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


@dataclass(frozen=True)
class PoolingConfig:
    modes: tuple[str, ...] = ("mean",)
    normalize: bool = False
    max_seq_length: int | None = None
    from_sentence_transformers: bool = False
    steps: Sequence[PooledStep] = ()

    def __post_init__(self) -> None:
        bad = [m for m in self.modes if m not in MODES]
        if not self.modes or bad:
            raise ValueError(f"pooling modes {self.modes!r} are not among {MODES}")
        object.__setattr__(self, "steps", tuple(self.steps))

    @property
    def mode(self) -> str:
        """The one mode, or the modes joined with '+' when several are concatenated."""
        return "+".join(self.modes)

    def dimensions(self, hidden_size: int) -> int:
        """The width of the embeddings of a model of HIDDEN_SIZE: the last Dense's out_features, or
        the pooled width (hidden size × modes)."""
        d = hidden_size * len(self.modes)
        for step in self.steps:
            d = step.width(d)
        return d

    def describe(self) -> list[str]:
        """The modules after pooling, for the card (`Dense(2_Dense: 64→16, Tanh)`, …)."""
        return [repr(s) for s in self.steps] + (["Normalize"] if self.normalize else [])


def _last_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of each row's last real token, for right or left padding."""
    positions = torch.arange(1, mask.shape[1] + 1, device=mask.device)
    return (mask.to(positions.dtype) * positions).argmax(dim=1)


def _pool_one(mode: str, hidden: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    b, t, _ = hidden.shape
    if mode == "cls":
        return hidden[:, 0]
    if mode == "lasttoken":
        if mask is None:
            return hidden[:, -1]
        return hidden[torch.arange(b, device=hidden.device), _last_index(mask)]
    if mode == "max":
        if mask is None:
            return hidden.amax(dim=1)
        return hidden.masked_fill(~mask.to(torch.bool)[..., None], -1e9).amax(dim=1)
    if mode == "weightedmean":
        w = torch.arange(1, t + 1, device=hidden.device, dtype=hidden.dtype).expand(b, t)
        w = w if mask is None else w * mask.to(hidden.dtype)
        return torch.einsum("bt,bth->bh", w, hidden) / w.sum(dim=1, keepdim=True).clamp(min=1e-9)
    # mean / mean_sqrt_len
    if mask is None:
        total = hidden.sum(dim=1)
        count = torch.full((b, 1), float(t), device=hidden.device, dtype=hidden.dtype)
    else:
        m = mask.to(hidden.dtype)
        total = torch.einsum("bt,bth->bh", m, hidden)
        count = m.sum(dim=1, keepdim=True).clamp(min=1e-9)
    return total / (count if mode == "mean" else count.sqrt())


def pool_tokens(hidden: torch.Tensor, mask: torch.Tensor | None, cfg: PoolingConfig) -> torch.Tensor:
    """[B, T, H] hidden states and a [B, T] mask (1 = real token; None = no padding) → the pooled
    modes concatenated, [B, H × modes]."""
    parts = [_pool_one(mode, hidden, mask) for mode in cfg.modes]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


def finish(pooled: torch.Tensor, cfg: PoolingConfig) -> torch.Tensor:
    """The modules after pooling, in order, then the final L2 normalization when configured."""
    for step in cfg.steps:
        pooled = step(pooled)
    if cfg.normalize:
        pooled = F.normalize(pooled, p=2.0, dim=1)
    return pooled


def pool(hidden: torch.Tensor, mask: torch.Tensor | None, cfg: PoolingConfig) -> torch.Tensor:
    """[B, T, H] hidden states and a [B, T] mask (1 = real token; None = no padding) → [B, D]."""
    return finish(pool_tokens(hidden, mask, cfg), cfg)
