"""Run an ASGI app on uvicorn (uvloop + httptools), over TCP or a Unix socket."""

from __future__ import annotations

import os

import uvicorn

from vllm_srun.domain import bounds


def run_server(  # type: ignore[no-untyped-def]  # app: any ASGI callable
    app, *, host: str = bounds.HOST.default, port: int = bounds.PORT.default, uds: str | None = None,
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
        timeout_graceful_shutdown=30,
    )
    uvicorn.Server(config).run()
