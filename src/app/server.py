"""Start a worker from its container: the refusals that need the container's adapters, then the
runtime's HTTP app on uvicorn (uvloop + httptools, through the connection guard), over TCP or a
Unix socket (mode 0600, a stale one replaced, removed at exit)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
from collections.abc import Callable, Generator
from typing import Any

import uvicorn
from dependency_injector import providers

from vllm_srun.adapters.contracts import EngineSettings
from vllm_srun.adapters.http.connection_guard import ConnectionGuard
from vllm_srun.adapters.http.guarded_protocol import uvicorn_config
from vllm_srun.adapters.http.listeners import Listener, TlsFiles, ensure_descriptors
from vllm_srun.adapters.offload import SWITCH_INTERVAL_S
from vllm_srun.app.bootstrap import WorkerContainer
from vllm_srun.app.preflight import engine_arg_refusal, model_refusal
from vllm_srun.domain.errors import DomainError
from vllm_srun.domain.settings import bounds
from vllm_srun.domain.settings.dtypes import dtype_refusal, needs_bf16_warning

GRACEFUL_SHUTDOWN_S = 30  # after SIGTERM, in-flight requests may finish this long (deploy/kubernetes grace)


def check_worker(container: WorkerContainer) -> list[str]:
    """Refuse (ValueError, one line) what cannot run before anything loads: a device that is not
    here (or a GPU index out of range, `rocm` on a CUDA build), a dtype the device has no kernels
    for, an engine that is not installed, refuses the dtype or `--deterministic` or cannot run on
    the device, engine args the packages do not take (R-ARG-2). Returns warnings (e.g. bfloat16
    on a CPU without native BF16, R-DT-2)."""
    families = container.families()  # PluginConflict is a ValueError
    container.tracer()  # TracingUnavailable (an OTEL_* setting this install cannot honour) is a ValueError
    engines = container.engines()
    try:
        runtime = container.runtime()  # DeviceRefused (opening a model's device) is a ValueError
    except DomainError as exc:  # e.g. a served name given twice
        raise ValueError(exc.message) from None
    warnings = []
    limits = container.connection_limits()
    cap, warning = ensure_descriptors(limits.max_connections, limits.max_connections != bounds.MAX_CONNECTIONS.default)
    if warning:
        warnings.append(warning)
        container.connection_limits.override(providers.Object(dataclasses.replace(limits, max_connections=cap)))
    for served in runtime.models.values():
        device = runtime.device_for(served)
        where = f"model {served.name}: " if len(runtime.models) > 1 else ""
        engine = engines.resolve_name(served.engine)  # EngineRefused is a ValueError
        refusal = dtype_refusal(served.args.dtype, device.name, device.native_dtypes)
        settings = EngineSettings(dtype=served.args.dtype, deterministic=runtime.settings.deterministic)
        refusal = refusal or engines.flag_refusal(engine, settings) or engines.device_refusal(engine, device)
        if refusal:
            raise ValueError(where + refusal)
        refusal = engine_arg_refusal([served.target], served.args, container.store(), families, container.progress())
        if refusal:
            raise ValueError(where + refusal)
        refusal = model_refusal(served, device, container.store(), families, container.progress())
        if refusal:
            raise ValueError(where + refusal)
        if needs_bf16_warning(served.args.dtype, device.name, "bfloat16" in device.native_dtypes):
            warnings.append(
                where + "--dtype bfloat16 on a CPU without native BF16 (no avx512_bf16/amx_bf16): "
                "allowed, but emulated and slow"
            )
    return warnings


def run_worker(container: WorkerContainer, listener: Listener, *, log_level: str, tls: TlsFiles | None = None) -> int:
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # tokenizing stays on the preparing thread
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    runtime = container.runtime()
    app = container.app()
    print(
        f"serve: {', '.join(runtime.models)} on {listener.where} (device {runtime.device.name})",
        file=sys.stderr,
        flush=True,
    )
    try:
        run_server(app, listener, container.connection_guard(), log_level=log_level, on_exit=listener.remove, tls=tls)
    finally:
        listener.remove()
    return 0


class _Server(uvicorn.Server):
    """uvicorn, with a last step after its graceful shutdown and before it re-raises the signal
    that stopped it (which ends the process before any `finally` of ours could run)."""

    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None]) -> None:
        super().__init__(config)
        self.on_exit = on_exit

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        with super().capture_signals():
            try:
                yield
            finally:
                self.on_exit()


def run_server(
    app: Any,
    listener: Listener,
    guard: ConnectionGuard,
    *,
    log_level: str = bounds.LOG_LEVEL.default,
    on_exit: Callable[[], None] = lambda: None,
    tls: TlsFiles | None = None,
) -> None:
    config = uvicorn_config(
        app,
        guard,
        lifespan="on",
        log_level=log_level,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        **(tls.uvicorn_options() if tls is not None else {}),  # R-AUTH-4
    )
    _Server(config, on_exit).run(sockets=[listener.sock])
