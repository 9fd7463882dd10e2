"""Which of our encoder architectures reads a package: `config.json`'s `model_type` → its loader.

Each loader is `load(folder, dtype) -> (encoder, head | None)` in the architecture's own module
(`encoder_arch.py` says what the encoder and the head must offer); modules are imported only when
a package of theirs loads. The architecture modules import the package readers from
`manifest.py`, never this module, so no import runs in a circle through the table.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

from vllm_srun.adapters.models.manifest import read_config

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
    "qwen3_5": "qwen3_5_encoder:load_qwen3_5_encoder",
    "qwen3_5_text": "qwen3_5_encoder:load_qwen3_5_encoder",
}
# decoder backbones: served by the encoder family when the package is an embedder, a reranker or a
# classifier (families/decoder_packages.py), by the decision family when it is a causal LM
DECODER_TYPES = frozenset({"qwen3", "qwen2", "llama", "qwen3_5", "qwen3_5_text"})
ENCODER_TYPES = frozenset(ARCHITECTURES) - DECODER_TYPES


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
