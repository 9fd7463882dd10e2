"""The runtime manifest `srun.json` of a package (R-PKG-1): family, surfaces, published dtype,
max input tokens, labels… Every field is optional; a family fills the gaps from the package."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MANIFEST = "srun.json"


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
