"""The composition root (dependency-injector): settings in, runtime and HTTP app out.

Tests build the same container and override providers with fakes.
"""

from __future__ import annotations

from dependency_injector import containers, providers

from vllm_srun.adapters.engines.factory import default_engines
from vllm_srun.adapters.http.app import create_app
from vllm_srun.adapters.serving.runtime import Runtime


class WorkerContainer(containers.DeclarativeContainer):
    config = providers.Configuration()

    # which engines exist (native torch + oneDNN fast path, ONNX Runtime); families get it through
    # LoadOptions and never import an engine module
    engines = providers.Singleton(default_engines)

    runtime = providers.Singleton(
        Runtime,
        models=config.models,
        device=config.device,
        engine=config.engine,
        threads=config.threads,
        progress=config.progress,
        result_cache_entries=config.result_cache_entries,
        engines=engines,
    )

    app = providers.Singleton(
        create_app,
        runtime=runtime,
        max_request_bytes=config.max_request_bytes,
    )
