"""Sentence pooling as sentence-transformers configures it, and the pooling maths.

Read from a model folder:
- `modules.json`: the folder of the `…Pooling` module (default `1_Pooling`); a `…Normalize` module
  means the embeddings are L2-normalized.
- `<pooling folder>/config.json`: the `pooling_mode_*` flags (cls, max, mean, mean_sqrt_len,
  weightedmean, lasttoken) or a `pooling_mode` string. Several flags concatenate their results in
  sentence-transformers' order (cls, max, mean, mean_sqrt_len, weightedmean, lasttoken).
- `sentence_bert_config.json`: `max_seq_length` (None when absent).

Defaults when a folder has no sentence-transformers files: `cls` pooling for a model with a
classification head (`default_mode="cls"`), `mean` otherwise, no normalization.

`pool(hidden, mask, cfg)` takes right- or left-padded rows; `mask` None means every row is full.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

MODES = ("cls", "max", "mean", "mean_sqrt_len", "weightedmean", "lasttoken")
_ALIASES = {
    "mean_tokens": "mean",
    "cls_token": "cls",
    "max_tokens": "max",
    "mean_sqrt_len_tokens": "mean_sqrt_len",
    "weightedmean_tokens": "weightedmean",
    "last_token": "lasttoken",
}


@dataclass(frozen=True)
class PoolingConfig:
    modes: tuple[str, ...] = ("mean",)
    normalize: bool = False
    max_seq_length: int | None = None
    from_sentence_transformers: bool = False

    def __post_init__(self) -> None:
        bad = [m for m in self.modes if m not in MODES]
        if not self.modes or bad:
            raise ValueError(f"pooling modes {self.modes!r} are not among {MODES}")

    @property
    def mode(self) -> str:
        """The one mode, or the modes joined with '+' when several are concatenated."""
        return "+".join(self.modes)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from exc


def _modes_from(raw: dict[str, Any]) -> tuple[str, ...]:
    if isinstance(raw.get("pooling_mode"), str):
        name = raw["pooling_mode"]
        return (_ALIASES.get(name, name),)
    return tuple(
        m
        for m in MODES
        if raw.get(f"pooling_mode_{m}_tokens") or raw.get(f"pooling_mode_{m}_token") or raw.get(f"pooling_mode_{m}")
    )


def load_pooling_config(folder: Path, default_mode: str = "mean") -> PoolingConfig:
    """The pooling of the model in FOLDER (see the module doc for the files and the defaults)."""
    folder = Path(folder)
    pooling_dir, normalize, found = folder / "1_Pooling", False, False
    modules_path = folder / "modules.json"
    if modules_path.exists():
        found = True
        for module in _read_json(modules_path):
            kind = str(module.get("type", ""))
            if kind.endswith(".Pooling") or kind == "Pooling":
                pooling_dir = folder / module.get("path", "1_Pooling")
            elif kind.endswith(".Normalize") or kind == "Normalize":
                normalize = True
    modes: tuple[str, ...] = (default_mode,)
    if (pooling_dir / "config.json").exists():
        found = True
        modes = _modes_from(_read_json(pooling_dir / "config.json")) or modes
    max_len = None
    if (folder / "sentence_bert_config.json").exists():
        found = True
        value = _read_json(folder / "sentence_bert_config.json").get("max_seq_length")
        max_len = int(value) if value is not None else None
    return PoolingConfig(modes=modes, normalize=normalize, max_seq_length=max_len, from_sentence_transformers=found)


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


def pool(hidden: torch.Tensor, mask: torch.Tensor | None, cfg: PoolingConfig) -> torch.Tensor:
    """[B, T, H] hidden states and a [B, T] mask (1 = real token; None = no padding) → [B, D]."""
    parts = [_pool_one(mode, hidden, mask) for mode in cfg.modes]
    out = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
    if cfg.normalize:
        out = F.normalize(out, p=2.0, dim=1)
    return out
