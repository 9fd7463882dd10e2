"""Start a worker from its container: the refusals that need the container's adapters, then the
runtime's HTTP app on uvicorn (uvloop + httptools), over TCP or a Unix socket."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import uvicorn

from vllm_srun.app.container import WorkerContainer
from vllm_srun.app.preflight import engine_arg_refusal
from vllm_srun.domain import bounds
from vllm_srun.domain.dtypes import dtype_refusal, needs_bf16_warning
from vllm_srun.domain.errors import DomainError

GRACEFUL_SHUTDOWN_S = 30  # after SIGTERM, in-flight requests may finish this long (deploy/kubernetes grace)


def check_worker(container: WorkerContainer) -> list[str]:
    """Refuse (ValueError, one line) what cannot run before anything loads: a device that is not
    here (or a GPU index out of range, `rocm` on a CUDA build), a dtype the device has no kernels
    for, an engine that is not installed or cannot run on the device, engine args the packages do
    not take (R-ARG-2). Returns warnings (e.g. bfloat16 on a CPU without native BF16, R-DT-2)."""
    families = container.families()  # PluginConflict is a ValueError
    engines = container.engines()
    try:
        runtime = container.runtime()  # DeviceRefused (opening a model's device) is a ValueError
    except DomainError as exc:  # e.g. a served name given twice
        raise ValueError(exc.message) from None
    engine = engines.resolve_name(container.config.engine())  # EngineRefused is a ValueError
    warnings = []
    for served in runtime.models.values():
        device = runtime.device_for(served)
        where = f"model {served.name}: " if len(runtime.models) > 1 else ""
        refusal = dtype_refusal(served.args.dtype, device.name, engine, device.native_dtypes)
        refusal = refusal or engines.device_refusal(engine, device)
        if refusal:
            raise ValueError(where + refusal)
        refusal = engine_arg_refusal(
            [served.artifact], served.args, container.store(), families, container.config.progress()
        )
        if refusal:
            raise ValueError(where + refusal)
        if needs_bf16_warning(served.args.dtype, device.name, "bfloat16" in device.native_dtypes):
            warnings.append(
                where + "--dtype bfloat16 on a CPU without native BF16 (no avx512_bf16/amx_bf16): "
                "allowed, but emulated and slow"
            )
    return warnings


def run_worker(container: WorkerContainer, *, host: str, port: int, uds: str | None, log_level: str) -> None:
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    runtime = container.runtime()
    app = container.app()
    where = f"unix:{uds}" if uds else f"http://{host}:{port}"
    print(f"serve: {', '.join(runtime.models)} on {where} (device {runtime.device.name})", file=sys.stderr, flush=True)
    run_server(app, host=host, port=port, uds=uds, log_level=log_level)


def run_server(
    app: Any,
    *,
    host: str = bounds.HOST.default,
    port: int = bounds.PORT.default,
    uds: str | None = None,
    log_level: str = bounds.LOG_LEVEL.default,
) -> None:
    if uds and os.path.exists(uds):
        os.unlink(uds)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        uds=uds,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        access_log=False,
        log_level=log_level,
        timeout_keep_alive=30,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )
    uvicorn.Server(config).run()
