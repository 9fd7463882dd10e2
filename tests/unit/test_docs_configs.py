"""Every front config and models file the docs show loads as written (a copied sample that is
refused is a trip a newcomer meets first): a ```yaml block with `global.model_catalog` is a whole
front config, one with `models:` a whole models file; a block of only `global:` settings is a
fragment of one and must sit under `global:`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from vllm_srun.adapters.config.loader import conversion_problems, load_config_text
from vllm_srun.adapters.config.models_file import ModelsFile
from vllm_srun.adapters.config.spellings import canonical_models_file

DOCS = Path(__file__).resolve().parents[2] / "docs"
BLOCK = re.compile(r"```yaml\n(.*?)```", re.S)


def _blocks() -> list[tuple[str, str]]:
    found = []
    for page in sorted(DOCS.glob("*.md")):
        for number, text in enumerate(BLOCK.findall(page.read_text(encoding="utf-8")), 1):
            found.append((f"{page.name}#{number}", text))
    return found


@pytest.mark.parametrize(("where", "text"), _blocks(), ids=[w for w, _ in _blocks()])
def test_every_config_sample_loads(where: str, text: str) -> None:
    data = yaml.safe_load(text)
    if not isinstance(data, dict) or "apiVersion" in data or "resources" in data:
        return  # Kubernetes manifests and kustomizations: tests/integration/test_kubernetes_manifests.py
    assert "deployments" not in data and "model_catalog" not in data, f"{where}: a fragment outside global:"
    if "models" in data:
        data, problems = canonical_models_file(data)
        assert problems + conversion_problems(data, ModelsFile, source=where) == []
    elif "model_catalog" in (data.get("global") or {}):
        load_config_text(text, source=where)
