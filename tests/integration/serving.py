"""Serve packages in-process: the real Runtime and litestar app behind litestar's TestClient,
whose every answer is checked against the worker's OpenAPI document (`tests/openapi_check.py`)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dependency_injector import containers
from litestar.testing import TestClient

from tests.openapi_check import check
from tests.stores import session_store
from vllm_srun.adapters.config.settings import WorkerSettings
from vllm_srun.adapters.serving.runtime import Runtime
from vllm_srun.app.bootstrap import WorkerContainer, bootstrap_worker
from vllm_srun.domain.settings.engine_args import EngineArgs
from vllm_srun.domain.worker.worker_settings import ModelSpec

BOOTSTRAP_KEYWORDS = ("cpu", "adaptive_threads", "wait_policy", "progress", "check_golden")


def container_for(
    models: list[Path | tuple[Path, EngineArgs] | ModelSpec], *, adapters: dict[str, Any] | None = None, **settings: Any
) -> WorkerContainer:
    """The worker of these packages through `bootstrap_worker`, with the test session's store.
    SETTINGS: fields of the settings record (`admission=AdmissionLimits(...)` sets both of its
    fields), or `bootstrap_worker`'s keywords; ADAPTERS: ready objects replacing providers."""
    specs = [
        m if isinstance(m, ModelSpec) else ModelSpec(str(m[0]), m[1]) if isinstance(m, tuple) else ModelSpec(str(m))
        for m in models
    ]
    keywords = {name: settings.pop(name) for name in BOOTSTRAP_KEYWORDS if name in settings}
    limits = settings.pop("admission", None)
    if limits is not None:
        settings.update(max_queue=limits.max_queue, max_queued_tokens=limits.max_queued_tokens)
    record = WorkerSettings(**settings).normalized()
    return bootstrap_worker(record, specs=specs, **keywords, **{"store": session_store(), **(adapters or {})})


@contextmanager
def serving(
    models: list[Path | tuple[Path, EngineArgs] | ModelSpec] | WorkerContainer, **settings: Any
) -> Iterator[tuple[TestClient, Runtime]]:
    """Yield (client, runtime) once every model finished loading (ready or failed). MODELS is a
    list of packages (a container is built for them) or a container tests have overridden."""
    container = models if isinstance(models, containers.Container) else container_for(models, **settings)
    rt = container.runtime()
    with TestClient(container.app(), timeout=60) as client:
        client.event_hooks["response"].append(check)  # every answer as the OpenAPI document says
        deadline = time.monotonic() + 120
        while not rt.loaded.is_set():
            assert time.monotonic() < deadline, "models did not load in 120 s"
            time.sleep(0.05)
        yield client, rt
