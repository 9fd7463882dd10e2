"""Load the float tensors of a safetensors checkpoint (one file, or every `*.safetensors` file of a
folder) into one name → tensor map.

- Non-float tensors are skipped: buffers such as all-MiniLM-L6-v2's int64 `embeddings.position_ids`
  are rebuilt by the model code, never read.
- A task-model prefix (`bert.`, `roberta.`, `model.`, `distilbert.`, `mpnet.`, …) is stripped, so
  `bert.encoder.layer.0…` (a `BertForSequenceClassification` checkpoint) and `encoder.layer.0…` (a
  bare `BertModel` such as all-MiniLM) both read as `encoder.layer.0…`; head tensors (`classifier.*`,
  `pre_classifier.*`) never had one.
- Old TF-converted names `LayerNorm.gamma` / `LayerNorm.beta` read as `.weight` / `.bias`.
- An int8 tensor with a float `<name>_scale` beside it (one value per row: an int8 package of
  `vllm-srun quantize`, `models/quantize.py`) reads as the float tensor `int8 × scale`.
- A missing tensor raises `WeightsError` naming the key and the checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from vllm_srun.adapters.models.quantize import SCALE_SUFFIX, dequantize_rows

MODEL_PREFIXES: tuple[str, ...] = ("bert.", "roberta.", "model.", "distilbert.", "mpnet.", "deberta.")
_LEGACY_SUFFIXES = {".gamma": ".weight", ".beta": ".bias"}


class WeightsError(ValueError):
    """The checkpoint is unreadable or lacks a tensor the model needs."""


def safetensors_files(path: Path) -> list[Path]:
    """The checkpoint files: PATH itself, or every `*.safetensors` in the folder PATH (sorted)."""
    path = Path(path)
    if path.is_file():
        return [path]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise WeightsError(f"no *.safetensors file in {path}")
    return files


def _canonical(name: str) -> str:
    for prefix in MODEL_PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix) :]
            break
    for old, new in _LEGACY_SUFFIXES.items():
        if name.endswith(old):
            name = name[: -len(old)] + new
    return name


class Weights:
    """Float tensors by canonical name, with a `take` that explains what is missing."""

    def __init__(self, tensors: dict[str, torch.Tensor], source: str) -> None:
        self.tensors = tensors
        self.source = source

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def __len__(self) -> int:
        return len(self.tensors)

    def names(self) -> list[str]:
        return sorted(self.tensors)

    def take(self, name: str) -> torch.Tensor:
        try:
            return self.tensors[name]
        except KeyError:
            raise WeightsError(
                f"tensor {name!r} is missing from {self.source} "
                f"({len(self.tensors)} float tensors; a prefix among {', '.join(MODEL_PREFIXES)} is ignored)"
            ) from None

    def take_all(self, names: Iterable[str]) -> list[torch.Tensor]:
        return [self.take(n) for n in names]


def _int8_with_scales(f: Any) -> dict[str, str]:
    """The int8 tensors of an open safetensors file that have a `<name>_scale` beside them → that name."""
    keys = set(f.keys())
    return {k: k + SCALE_SUFFIX for k in keys if k + SCALE_SUFFIX in keys and f.get_slice(k).get_dtype() == "I8"}


def _dequantized(q: torch.Tensor, scale: torch.Tensor, where: str) -> torch.Tensor:
    if q.dim() != 2 or not scale.is_floating_point() or tuple(scale.shape) != (q.shape[0],):
        raise WeightsError(
            f"{where}: an int8 weight needs one float scale per row (int8 {tuple(q.shape)}, scale {tuple(scale.shape)})"
        )
    return dequantize_rows(q, scale)


def load_weights(path: Path, dtype: torch.dtype | None = torch.float32) -> Weights:
    """Read every float tensor of the checkpoint at PATH, cast to DTYPE (None keeps the stored one)."""
    files = safetensors_files(path)
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            handle = safe_open(str(file), framework="pt")
        except Exception as exc:  # safetensors raises its own error types
            raise WeightsError(f"cannot read {file}: {exc}") from exc
        with handle as f:
            int8 = _int8_with_scales(f)
            scales = set(int8.values())
            for raw in f.keys():  # noqa: SIM118 - a safetensors handle is not iterable
                if raw in scales:
                    continue  # a scale: read with its int8 tensor
                tensor = f.get_tensor(raw)
                if raw in int8:
                    tensor = _dequantized(tensor, f.get_tensor(int8[raw]), f"{file}: {raw}")
                if not tensor.is_floating_point():
                    continue
                name = _canonical(raw)
                if name in tensors:
                    raise WeightsError(f"tensor {name!r} appears twice in {path} (as {raw!r} and another key)")
                if dtype is not None and tensor.dtype != dtype:
                    tensor = tensor.to(dtype)
                tensors[name] = tensor
    return Weights(tensors, str(path))
