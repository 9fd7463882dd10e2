"""What a card tells about a package (R-API-6): its weights hash, the manifest hash, where it
comes from (`repo`, `revision`), its weight count, and the bytes its loaded weights hold.

- `weights_sha256` (the card's `model_sha256`): the SHA-256 of the files that decide the answers
  (weights, config, tokenizer, prompts, a ColBERT head, int8 calibration ranges), read before the
  load (engines key their caches by it).

- `manifest_sha256` identifies the package as a whole, cheaply (no weight is read): the SHA-256
  of srun.json's bytes (none when the package has no srun.json), then one `path<TAB>size` line
  per file of the package, sorted by path (POSIX, relative to the package folder). It changes when
  the manifest changes or a file is added, removed or resized; `model_sha256` (the weights hash,
  `weights_sha256` below) is what says two packages answer alike.
- `repo` and `revision`: a Hub snapshot's repository and commit (read from its cache path,
  `hub.hub_origin`), else what srun.json declares (`repo`: a Hub repository id; `revision`: its
  40-hex commit), else a built-in catalog model's repository (revision null), else null (a local
  folder).
- `licence`: the licence srun.json declares (`licence` or `license`: an SPDX id or a name), else
  null (unknown: nothing is guessed from a README).
- `parameters`: the elements of every tensor the package's `.safetensors` files hold (read from
  their headers); None for a package without safetensors weights (a GGUF file).
- `resident_weight_bytes`: the bytes of the torch tensors a loaded model holds (each storage once),
  packed and reduced-precision copies included; what an engine holds outside torch (an ONNX
  Runtime session) is not seen.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_srun.adapters.catalog import CATALOG
from vllm_srun.adapters.contracts import MANIFEST
from vllm_srun.adapters.hub import hub_origin

REVISION = re.compile(r"^[0-9a-f]{40}$")
SAFETENSORS_HEADER_MAX = 100 << 20  # a header larger than this is not a safetensors header
WALK_DEPTH = 4  # attribute hops from the loaded model to the tensors it holds

ANSWER_FILES = frozenset(
    {
        "config.json",
        "tokenizer.json",
        "preprocessor_config.json",
        "config_sentence_transformers.json",  # prompts
        "colbert_linear.pt",  # multi-vector head (BGE-M3 layout)
        "embedding_ranges.json",  # int8/uint8 calibration ranges
    }
)


def weights_sha256(folder: Path) -> str:
    """Hash of the files that decide the model's answers (weights, config, tokenizer, prompts, a
    ColBERT head, int8 calibration ranges)."""
    digest = hashlib.sha256()
    for path in sorted(folder.iterdir()):
        if path.is_file() and (path.suffix in {".safetensors", ".onnx"} or path.name in ANSWER_FILES):
            digest.update(path.name.encode())
            with path.open("rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True, slots=True)
class PackageFacts:
    manifest_sha256: str
    repo: str | None
    revision: str | None
    parameters: int | None
    licence: str | None = None


def package_facts(folder: Path, artifact: str) -> PackageFacts:
    """The facts of the package in FOLDER, served as ARTIFACT (a path, stored or catalog name)."""
    origin = hub_origin(folder)
    declared = _declared(folder)
    repo: str | None
    revision: str | None
    if origin is not None:
        repo, revision = origin
    else:
        named, pinned = declared.get("repo"), declared.get("revision")
        entry = CATALOG.get(artifact)
        if isinstance(named, str) and named:
            repo = named
            revision = pinned if isinstance(pinned, str) and REVISION.match(pinned) else None
        else:
            repo, revision = (entry.repo if entry is not None else None), None
    licence = declared.get("licence", declared.get("license"))
    return PackageFacts(
        manifest_sha256=manifest_sha256(folder),
        repo=repo,
        revision=revision,
        parameters=parameter_count(folder),
        licence=licence if isinstance(licence, str) and licence else None,
    )


def _declared(folder: Path) -> dict[str, Any]:
    try:
        raw = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return raw if isinstance(raw, dict) else {}


def manifest_sha256(folder: Path) -> str:
    """The package's manifest hash (module doc)."""
    digest = hashlib.sha256()
    manifest = folder / MANIFEST
    if manifest.is_file():
        digest.update(manifest.read_bytes())
    digest.update(b"\0")
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(f"{path.relative_to(folder).as_posix()}\t{path.stat().st_size}\n".encode())
    return digest.hexdigest()


def parameter_count(folder: Path) -> int | None:
    """Elements of the tensors in FOLDER's `.safetensors` files; None when it has none."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for path in files:
        try:
            with path.open("rb") as fh:
                (size,) = struct.unpack("<Q", fh.read(8))
                if size > SAFETENSORS_HEADER_MAX:
                    return None
                header = json.loads(fh.read(size))
        except (OSError, ValueError, struct.error):
            return None
        for name, entry in header.items():
            if name == "__metadata__" or not isinstance(entry, dict):
                continue
            count = 1
            for dim in entry.get("shape", []):
                count *= int(dim)
            total += count
    return total


def resident_weight_bytes(model: object) -> int:
    """Bytes of the torch tensors MODEL holds, within WALK_DEPTH attribute hops (module doc)."""
    import torch

    seen_objects: set[int] = set()
    storages: dict[tuple[str, int], int] = {}

    def add(tensor: torch.Tensor) -> None:
        try:
            storage = tensor.untyped_storage()
            key, size = (str(tensor.device), storage.data_ptr()), storage.nbytes()
        except (RuntimeError, NotImplementedError):  # opaque layouts (mkldnn): count their elements
            key, size = ("opaque", id(tensor)), tensor.numel() * tensor.element_size()
        storages[key] = max(storages.get(key, 0), size)

    def walk(value: Any, depth: int) -> None:
        if id(value) in seen_objects or depth < 0:
            return
        seen_objects.add(id(value))
        if isinstance(value, torch.Tensor):
            add(value)
        elif isinstance(value, torch.nn.Module):
            for tensor in (*value.parameters(), *value.buffers()):
                add(tensor)
            for inner in vars(value).values():  # tensors kept beside the module's own (packed copies)
                if not isinstance(inner, (dict, torch.nn.Module)):
                    walk(inner, depth - 1)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item, depth - 1)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item, depth - 1)
        elif hasattr(value, "__dict__") and not isinstance(value, type):
            for item in vars(value).values():
                walk(item, depth - 1)
        elif hasattr(value, "__slots__"):
            for name in getattr(value, "__slots__", ()):
                walk(getattr(value, name, None), depth - 1)

    walk(model, WALK_DEPTH)
    return sum(storages.values())
