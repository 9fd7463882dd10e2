"""Which of our encoder architectures reads a package: `config.json`'s `model_type` → its loader.

Each loader is `load(folder, dtype) -> (encoder, head | None)` in the architecture's own module
(`encoder_arch.py` says what the encoder and the head must offer); modules are imported only when
a package of theirs loads.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # importing this table never loads torch (family detection reads it)
    import torch

    from vllm_srun.adapters.models.encoder_arch import EncoderHead, EncoderModule

# model_type → "module:function" under vllm_srun.adapters.models
ARCHITECTURES: dict[str, str] = {
    "bert": "bert:load_bert",
    "roberta": "bert:load_bert",
    "xlm-roberta": "bert:load_bert",
    "camembert": "bert:load_bert",
    "distilbert": "distilbert:load_distilbert",
    "mpnet": "mpnet:load_mpnet",
    "deberta-v2": "deberta_v2:load_deberta_v2",
    "modernbert": "modernbert:load_modernbert",
    "qwen3": "decoder_encoder:load_decoder_encoder",
    "qwen2": "decoder_encoder:load_decoder_encoder",
    "llama": "decoder_encoder:load_decoder_encoder",
}
# decoder backbones: served by the encoder family only when the package says so (families/decoder_packages.py)
DECODER_TYPES = frozenset({"qwen3", "qwen2", "llama"})
ENCODER_TYPES = frozenset(ARCHITECTURES) - DECODER_TYPES


def asks_for_yes_no(manifest: dict[str, Any]) -> bool:
    """Whether srun.json asks a decoder package to rerank by P(yes) against P(no): a `rerank` section
    or the `rerank` surface (the loader then builds the yes/no head unless the checkpoint has a
    `score` head of its own)."""
    return "rerank" in manifest or "rerank" in (manifest.get("surfaces") or ())


def read_config(folder: Path) -> dict[str, Any]:
    path = Path(folder) / "config.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from exc


def model_type(folder: Path) -> str:
    return str(read_config(folder).get("model_type", "")).lower()


def load_encoder(folder: Path, dtype: torch.dtype | None = None) -> tuple[EncoderModule, EncoderHead | None]:
    """The encoder (and its head when the checkpoint has one) of the package in FOLDER (FP32 by default)."""
    import torch

    dtype = dtype or torch.float32
    kind = model_type(folder)
    target = ARCHITECTURES.get(kind)
    if target is None:
        raise ValueError(
            f"model_type {kind!r} is not an encoder architecture we serve ({', '.join(sorted(ARCHITECTURES))})"
        )
    module, function = target.split(":")
    loader = getattr(importlib.import_module(f"vllm_srun.adapters.models.{module}"), function)
    return loader(Path(folder), dtype)
