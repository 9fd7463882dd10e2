"""Run an ASGI app on uvicorn (uvloop + httptools), over TCP or a Unix socket."""

from __future__ import annotations

import os

import uvicorn


def run_server(app, *, host: str = "127.0.0.1", port: int = 8100, uds: str | None = None, log_level: str = "info") -> None:  # type: ignore[no-untyped-def]
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
