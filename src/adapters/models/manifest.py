"""The two JSON files a package describes itself with.

- `srun.json`, the runtime manifest (R-PKG-1): family, surfaces, published dtype, max input
  tokens, labels… Every field is optional; a family fills the gaps from the package.
- `config.json`, the checkpoint's own (Hugging Face) configuration: `read_config`.

They live with the model code because both the families (which family, which surfaces) and the
model code (the architectures' configs, a reranker's prompt in `prompted_pairs.py`, a decoder's
yes/no head in `decoder_encoder.py`) read them, and model code never imports a family."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vllm_srun.adapters.contracts import MANIFEST

__all__ = ["MANIFEST", "asks_for_yes_no", "read_config", "read_manifest", "write_manifest"]


def read_manifest(folder: Path) -> dict[str, Any]:
    path = Path(folder) / MANIFEST
    if not path.exists():
        return {}
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from exc
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return raw


def write_manifest(folder: Path, manifest: dict[str, Any]) -> Path:
    path = Path(folder) / MANIFEST
    path.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return path


def asks_for_yes_no(manifest: dict[str, Any]) -> bool:
    """Whether srun.json asks a decoder package to rerank by P(yes) against P(no): a `rerank` section
    or the `rerank` surface (the loader then builds the yes/no head unless the checkpoint has a
    `score` head of its own)."""
    return "rerank" in manifest or "rerank" in (manifest.get("surfaces") or ())


def read_config(folder: Path) -> dict[str, Any]:
    """`config.json` of FOLDER; ValueError when it is missing or not JSON."""
    path = Path(folder) / "config.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from exc
