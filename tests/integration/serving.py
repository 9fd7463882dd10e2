"""Serve packages in-process: the real Runtime and litestar app behind litestar's TestClient."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dependency_injector import containers, providers
from litestar.testing import TestClient

from tests.stores import session_store
from vllm_srun.adapters.serving.runtime import Runtime
from vllm_srun.app.container import WorkerContainer, worker_container
from vllm_srun.domain.engine_args import EngineArgs
from vllm_srun.domain.worker_settings import ModelSpec


def container_for(models: list[Path | tuple[Path, EngineArgs] | ModelSpec], **settings: Any) -> WorkerContainer:
    """The worker container of these packages, with the test session's store."""
    specs = [
        m if isinstance(m, ModelSpec) else ModelSpec(str(m[0]), m[1]) if isinstance(m, tuple) else ModelSpec(str(m))
        for m in models
    ]
    container = worker_container(specs, **settings)
    container.store.override(providers.Object(session_store()))
    return container


@contextmanager
def serving(
    models: list[Path | tuple[Path, EngineArgs] | ModelSpec] | WorkerContainer, **settings: Any
) -> Iterator[tuple[TestClient, Runtime]]:
    """Yield (client, runtime) once every model finished loading (ready or failed). MODELS is a
    list of packages (a container is built for them) or a container tests have overridden."""
    container = models if isinstance(models, containers.Container) else container_for(models, **settings)
    rt = container.runtime()
    with TestClient(container.app(), timeout=60) as client:
        deadline = time.monotonic() + 120
        while not rt.loaded.is_set():
            assert time.monotonic() < deadline, "models did not load in 120 s"
            time.sleep(0.05)
        yield client, rt
