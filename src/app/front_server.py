"""The composition root of `vllm-sr serve`: checks that refuse before any worker starts, then
the fleet, the HTTP app on uvicorn, and the signals.

Shutdown (R-REP, reliability.md "Graceful drain"): the first SIGTERM (or SIGINT) closes
admission — new requests get 503 `not_ready` with `Connection: close` and /health turns
503 — while requests in flight finish (up to `--drain-timeout`); then the workers stop
(SIGTERM, SIGKILL after 10 s), the server closes and the process exits 0. A second signal
kills the workers and exits at once (status 1).

Reload (R-REP-2): SIGHUP reads the config again and applies it live
(`adapters/front/reconfigure.py`); the pid file (`adapters/front/control.py`) lets
`vllm-sr reload` find this front.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import uvicorn

from vllm_srun.adapters.config.schema import FrontConfig
from vllm_srun.adapters.contracts import quiet
from vllm_srun.adapters.front.app import FrontApp
from vllm_srun.adapters.front.control import FrontRecord, remove_pid_file, write_pid_file
from vllm_srun.adapters.front.fleet import Fleet
from vllm_srun.adapters.front.proxy import Proxy
from vllm_srun.adapters.front.reconfigure import Reconfigurer
from vllm_srun.adapters.http.connection_guard import ConnectionGuard
from vllm_srun.adapters.http.guarded_protocol import uvicorn_config
from vllm_srun.adapters.http.listeners import TlsFiles, bind_tcp, ensure_descriptors
from vllm_srun.adapters.offload import SWITCH_INTERVAL_S
from vllm_srun.adapters.workers.command import hub_target
from vllm_srun.adapters.workers.cpu_budget import managed_worker_threads
from vllm_srun.adapters.workers.socket_dirs import clean_stale_socket_dirs, make_socket_dir
from vllm_srun.app.bootstrap import FrontContainer, bootstrap_front
from vllm_srun.domain.security.connections import ConnectionLimits
from vllm_srun.domain.settings import bounds

if TYPE_CHECKING:
    from vllm_srun.app.keys import Security

log = logging.getLogger("vllm_srun.front")
WORKER_STOP_GRACE_S = 10.0


@dataclass
class PreparedFront:
    fleet: Fleet
    proxy: Proxy
    app: FrontApp
    sock: socket.socket
    socket_dir: str
    where: str
    log_level: str
    reconfigurer: Reconfigurer
    guard: ConnectionGuard
    warnings: list[str]
    pid_file: Path | None = None
    host: str = bounds.HOST.default
    port: int = bounds.FRONT_PORT.default
    tls: TlsFiles | None = None  # R-AUTH-4


def _check_packages(config: FrontConfig, container: FrontContainer) -> None:
    """The worker's package-level refusals (e.g. `max_model_len` on an encoder), run here so
    they stop the front before any worker starts. Attached runtimes check their own."""
    from vllm_srun.app.preflight import engine_arg_refusal

    for name, deployment in config.deployments.items():
        if all(replica.attached for replica in deployment.placement()):
            continue
        args = deployment.engine_args()
        target = hub_target(deployment.artifact, deployment.revision)  # a Hub id at its revision (R-PKG-5)
        refusal = engine_arg_refusal([target], args, container.store(), container.families(), quiet)
        if refusal:
            raise ValueError(f"deployments.{name}: {refusal}")


def prepare_front(
    config: FrontConfig,
    *,
    host: str,
    port: int,
    max_request_bytes: int,
    log_level: str = "info",
    env: dict[str, str] | None = None,
    load_config: Callable[[], FrontConfig] | None = None,
    pid_file: Path | None = None,
    connection_limits: ConnectionLimits | None = None,
    security: Security | None = None,
    key_file: str | None = None,
    hub_cache: str | None = None,
    offline: bool = False,
) -> PreparedFront:
    """Everything short of starting workers; raises ValueError with a one-line refusal, or
    ConfigError (a ValueError) with one line per problem of the workers' settings.
    LOAD_CONFIG reads the config again on a reload (SIGHUP). KEY_FILE: the front's key file,
    whose tenant policies its managed workers apply (`--tenant-policies`, R-FAIR-1). HUB_CACHE and
    OFFLINE: where the checks resolve Hub id artifacts (`--cache-dir`, `--offline`; the workers
    get them through ENV)."""
    threads = managed_worker_threads(env)  # InvalidThreadOverride is a ValueError
    limits = connection_limits or ConnectionLimits()
    warnings: list[str] = []
    cap, warning = ensure_descriptors(limits.max_connections, limits.max_connections != bounds.MAX_CONNECTIONS.default)
    if warning:
        warnings.append(warning)
        limits = dataclasses.replace(limits, max_connections=cap)
    clean_stale_socket_dirs(tempfile.gettempdir())  # left by fronts that were killed
    socket_dir = make_socket_dir(tempfile.gettempdir())  # mode 0700: only this user reaches the workers
    container = bootstrap_front(
        config,
        socket_dir=socket_dir,
        threads=threads,
        max_request_bytes=max_request_bytes,
        worker_log_level="info" if log_level == "debug" else "warning",
        env=env,
        load_config=load_config,
        connection_limits=limits,
        auth=security.auth if security is not None else None,
        tenant_policies=os.path.abspath(key_file) if key_file is not None else None,
        hub_cache=hub_cache,
        offline=offline,
    )
    container.config.check_config.from_value(lambda new: _check_packages(new, container))
    sock = None
    try:  # the cheap refusals first: the workers' settings, the port; then the packages (a Hub download)
        fleet = container.fleet()  # ConfigError when a worker would refuse its settings
        sock = bind_tcp(host, port)
        _check_packages(config, container)
    except BaseException:
        if sock is not None:
            sock.close()
        shutil.rmtree(socket_dir, ignore_errors=True)
        raise
    proxy = container.proxy()
    app = container.app()
    port = sock.getsockname()[1]
    tls = security.tls if security is not None else None
    scheme = "https" if tls is not None else "http"
    where = f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"
    return PreparedFront(
        fleet,
        proxy,
        app,
        sock,
        socket_dir,
        where,
        log_level,
        container.reconfigurer(),
        container.connection_guard(),
        warnings,
        pid_file,
        host,
        port,
        tls,
    )


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: the front drains first."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


async def _serve(front: PreparedFront, drain_timeout_s: float) -> int:
    loop = asyncio.get_running_loop()
    config = uvicorn_config(
        front.app,
        front.guard,
        lifespan="off",
        log_level=front.log_level,
        timeout_graceful_shutdown=5,
        log_config=None,
        **(front.tls.uvicorn_options() if front.tls is not None else {}),
    )
    server = _Server(config)
    stop = asyncio.Event()
    signals = 0

    def on_signal(sig: signal.Signals) -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            log.warning("%s: draining (new requests get 503; %d in flight)", sig.name, front.proxy.active)
            front.proxy.draining = True
            stop.set()
            return
        log.warning("%s again: exiting now", sig.name)
        for handle in front.fleet.all_handles():
            if handle.process is not None:
                handle.process.kill_now()
        shutil.rmtree(front.socket_dir, ignore_errors=True)
        os._exit(1)

    def on_reload() -> None:
        if signals == 0:  # never while draining
            front.reconfigurer.request()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    loop.add_signal_handler(signal.SIGHUP, on_reload)
    await front.fleet.start()
    serving = asyncio.ensure_future(server.serve(sockets=[front.sock]))
    if front.pid_file is not None:
        write_pid_file(front.pid_file, FrontRecord(os.getpid(), front.host, front.port))
    names = ", ".join(f"{d.name} ({len(d.handles)} worker(s))" for d in front.fleet.deployments.values())
    print(f"vllm-sr: serving {names} on {front.where}", file=sys.stderr, flush=True)
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait({serving, stopped}, return_when=asyncio.FIRST_COMPLETED)
    deadline = loop.time() + drain_timeout_s
    while front.proxy.active > 0 and loop.time() < deadline and not serving.done():  # noqa: ASYNC110 - polls a count
        await asyncio.sleep(0.02)
    if front.proxy.active:
        log.warning("drain timeout: %d request(s) still in flight", front.proxy.active)
    await front.fleet.stop(WORKER_STOP_GRACE_S)
    server.should_exit = True
    with contextlib.suppress(Exception):
        await serving
    return 0


def run_front(front: PreparedFront, *, drain_timeout_s: float = 30.0) -> int:
    sys.setswitchinterval(SWITCH_INTERVAL_S)  # large bodies are decoded on a pool thread
    logging.basicConfig(
        level=front.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        import uvloop

        run_loop: Callable[[Coroutine[Any, Any, int]], int] = uvloop.run
    except ImportError:  # pragma: no cover - uvloop comes with uvicorn[standard]
        run_loop = asyncio.run
    try:
        return run_loop(_serve(front, drain_timeout_s))
    finally:
        shutil.rmtree(front.socket_dir, ignore_errors=True)
        if front.pid_file is not None:
            remove_pid_file(front.pid_file, os.getpid())
