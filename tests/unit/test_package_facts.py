"""What a card tells of a package besides its weights hash (`serving/package_facts.py`): the
manifest hash, where it comes from, its weight count and its loaded weights' bytes."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

from vllm_srun.adapters.serving.package_facts import (
    manifest_sha256,
    package_facts,
    parameter_count,
    resident_weight_bytes,
)


def _package(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "srun.json").write_text('{"family": "encoder"}')
    save_file({"a": torch.zeros(3, 4), "b": torch.zeros(5)}, str(folder / "model.safetensors"))
    return folder


def test_the_manifest_hash_follows_the_manifest_and_the_file_list(tmp_path: Path) -> None:
    folder = _package(tmp_path / "pkg")
    first = manifest_sha256(folder)
    assert len(first) == 64 and manifest_sha256(folder) == first
    (folder / "config.json").write_text("{ }")  # resized
    resized = manifest_sha256(folder)
    assert resized != first
    (folder / "srun.json").write_text('{"family": "ENCODER"}')  # same size, other manifest
    assert manifest_sha256(folder) != resized
    (folder / "sub").mkdir()
    before = manifest_sha256(folder)
    (folder / "sub" / "vocab.txt").write_text("x")
    assert manifest_sha256(folder) != before


def test_parameters_come_from_the_safetensors_headers(tmp_path: Path) -> None:
    folder = _package(tmp_path / "pkg")
    assert parameter_count(folder) == 3 * 4 + 5
    save_file({"c": torch.zeros(2, 2)}, str(folder / "model-2.safetensors"))
    assert parameter_count(folder) == 17 + 4
    empty = tmp_path / "gguf"
    empty.mkdir()
    assert parameter_count(empty) is None


def test_origin_local_folder_declared_catalog_and_hub_snapshot(tmp_path: Path) -> None:
    local = package_facts(_package(tmp_path / "local"), str(tmp_path / "local"))
    assert (local.repo, local.revision, local.parameters, local.licence) == (None, None, 17, None)
    declared = _package(tmp_path / "declared")
    (declared / "srun.json").write_text('{"repo": "org/name", "revision": "' + "a" * 40 + '", "license": "mit"}')
    facts = package_facts(declared, "declared")
    assert (facts.repo, facts.revision, facts.licence) == ("org/name", "a" * 40, "mit")
    catalog = package_facts(_package(tmp_path / "minilm"), "all-MiniLM-L6-v2")
    assert (catalog.repo, catalog.revision) == ("sentence-transformers/all-MiniLM-L6-v2", None)
    snapshot = _package(tmp_path / "hub" / "models--org--tiny" / "snapshots" / ("b" * 40))
    facts = package_facts(snapshot, "org/tiny")
    assert (facts.repo, facts.revision) == ("org/tiny", "b" * 40)


def test_resident_bytes_count_each_storage_once() -> None:
    class Loaded:
        def __init__(self) -> None:
            self.net = torch.nn.Linear(4, 8)  # 32 + 8 floats
            self.packed = torch.zeros(10, dtype=torch.bfloat16)  # a reduced-precision copy: 20 bytes
            self.alias = self.net.weight  # the same storage again
            self.parts = [torch.zeros(2, dtype=torch.int8)]

    assert resident_weight_bytes(Loaded()) == (32 + 8) * 4 + 20 + 2
