"""Who serves a decoder package (Qwen3 / Qwen2 / Llama backbones): the encoder family or the decision family.

A decoder checkpoint is an embedder or a yes/no reranker (encoder family: `/v1/embeddings`,
`/v1/rerank`) when the package says so in one of the ways they are published:
- a sentence-transformers package (`modules.json`: Qwen3-Embedding, gte-Qwen2 …);
- a bare backbone (`architectures` lists only `…Model`, no `…ForCausalLM` head);
- a `srun.json` with a `rerank` section (the Qwen3-Reranker recipe: template and yes/no tokens) or
  `surfaces` naming `embeddings` or `rerank`.
Any other decoder package is a decision model. A `srun.json` `family` always wins (registry).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vllm_srun.adapters.models.encoders import DECODER_TYPES
from vllm_srun.adapters.models.manifest import asks_for_yes_no, read_config, read_manifest

ENCODER_SURFACES = frozenset({"embeddings", "rerank"})


def _config(folder: Path) -> dict[str, Any]:
    """config.json, or nothing when it is missing or unreadable (detection then says no)."""
    try:
        return read_config(folder)
    except ValueError:
        return {}


def serves_encoder_surfaces(folder: Path) -> bool:
    """Whether the decoder package in FOLDER is an embedder or a yes/no reranker (module doc)."""
    folder = Path(folder)
    if (folder / "modules.json").is_file():
        return True
    try:
        manifest = read_manifest(folder)
    except ValueError:
        return False
    if asks_for_yes_no(manifest) or ENCODER_SURFACES & set(manifest.get("surfaces") or ()):
        return True
    architectures = [str(a) for a in _config(folder).get("architectures") or []]
    return bool(architectures) and all(a.endswith("Model") for a in architectures)


def is_decoder_encoder(folder: Path) -> bool:
    """A decoder-backbone package the encoder family serves."""
    kind = str(_config(folder).get("model_type", "")).lower()
    return kind in DECODER_TYPES and serves_encoder_surfaces(folder)
