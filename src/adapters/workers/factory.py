"""How the front builds a replica's worker: its key (what decides it), its handle (how to reach
it: a Unix socket for a managed worker, HTTP(S) for an attached one), its command line, and its
supervisor. Builds and starts nothing else: the fleet (`front/fleet.py`) decides which workers to
build (`domain/fleet/reconfiguration`) and starts them.
"""

from __future__ import annotations

import os
import ssl
import time
from collections.abc import Callable, Hashable
from urllib.parse import urlsplit

from vllm_srun.adapters.config.schema import DeploymentConfig, ReplicaConfig
from vllm_srun.adapters.config.settings import WorkerSettings
from vllm_srun.adapters.workers.command import is_cpu_device, worker_command, worker_settings
from vllm_srun.adapters.workers.http_client import WorkerClient, tls_context
from vllm_srun.adapters.workers.replica import ReplicaHandle
from vllm_srun.adapters.workers.supervisor import DeploymentView, EventSink, ReplicaSupervisor
from vllm_srun.domain.fleet.dispatch import Pool
from vllm_srun.domain.fleet.replicas import Replica


class WorkerFactory:
    """The front's worker settings (socket folder, CPU threads, body limit, log level, env) and
    the counters that name new workers (`<deployment>/<index>`, `w<n>.sock`): an index is never
    reused, so a restarted placement gets a new id."""

    def __init__(
        self,
        *,
        socket_dir: str,
        threads: int | None,
        max_request_bytes: int | None = None,
        worker_log_level: str = "warning",
        env: dict[str, str] | None = None,
        on_event: EventSink = lambda event, handle, detail: None,
        clock: Callable[[], float] = time.monotonic,
        tenant_policies: str | None = None,  # the front's key file: its tenants' policies (R-FAIR-1)
    ) -> None:
        self.tenant_policies = tenant_policies
        self.socket_dir = socket_dir
        self.threads = threads
        self.max_request_bytes = max_request_bytes
        self.worker_log_level = worker_log_level
        self.env = env
        self.on_event = on_event
        self.clock = clock
        self._sockets = 0
        self._next_index: dict[str, int] = {}

    def key(self, spec: DeploymentConfig, replica: ReplicaConfig) -> Hashable:
        """What decides a worker: its command (managed) or its endpoint (attached)."""
        if replica.attached:
            return ("attached", replica.endpoint, replica.model, spec.artifact, spec.revision)
        return ("managed", self.settings(spec, replica.device or "auto", ""), spec.revision)

    def settings(self, spec: DeploymentConfig, device: str, uds: str) -> WorkerSettings:
        return worker_settings(
            spec,
            device=device,
            uds=uds,
            threads=self.threads if is_cpu_device(device) else None,
            max_request_bytes=self.max_request_bytes,
            log_level=self.worker_log_level,
            tenant_policies=self.tenant_policies,
        )

    def build(
        self, deployment: DeploymentView, replica: ReplicaConfig, pool: Pool, problems: list[str]
    ) -> ReplicaSupervisor:
        """A new worker of DEPLOYMENT at REPLICA's placement, its record added to POOL; not
        started. The reasons a managed worker would refuse its settings go to PROBLEMS."""
        name = deployment.name
        index = self._next_index.get(name, 0)
        self._next_index[name] = index + 1
        door: tuple[str | None, ssl.SSLContext | None] = (None, None)
        if replica.attached:
            try:
                door = endpoint_door(deployment.config, self.env)
            except ValueError as exc:
                problems.append(f"deployments.{name}: {exc}")
        handle = self._handle(name, index, replica, pool, socket=self._sockets, door=door)
        self._sockets += 1  # attached workers take a number too: socket names follow the worker count
        command = None
        if not replica.attached:
            settings = self.settings(deployment.config, replica.device or "auto", handle.socket_path or "")
            problems += [f"deployments.{name}: {problem}" for problem in settings.problems()]
            command = worker_command(settings)
        return ReplicaSupervisor(
            handle, deployment, command=command, env=self.env, clock=self.clock, on_event=self.on_event
        )

    def _handle(
        self,
        deployment: str,
        index: int,
        replica: ReplicaConfig,
        pool: Pool,
        socket: int,
        door: tuple[str | None, ssl.SSLContext | None] = (None, None),
    ) -> ReplicaHandle:
        replica_id = f"{deployment}/{index}"
        record = pool.add(Replica(replica_id))
        if replica.attached:
            url = urlsplit(replica.endpoint or "")
            token, context = door
            if url.scheme == "unix":  # an attached runtime on a Unix socket (`vllm-srun serve --uds`)
                client = WorkerClient(uds=url.path, token=token)
                return ReplicaHandle(replica_id, deployment, replica, record, client, worker_model=replica.model)
            port = url.port or (443 if url.scheme == "https" else 80)
            tls = (context or True) if url.scheme == "https" else False
            client = WorkerClient(host=url.hostname, port=port, base_path=url.path, tls=tls, token=token)
            return ReplicaHandle(replica_id, deployment, replica, record, client, worker_model=replica.model)
        path = os.path.join(self.socket_dir, f"w{socket}.sock")
        return ReplicaHandle(
            replica_id,
            deployment,
            replica,
            record,
            WorkerClient(uds=path),
            socket_path=path,
            threads=self.threads if is_cpu_device(replica.device or "auto") else None,
        )


def endpoint_door(spec: DeploymentConfig, env: dict[str, str] | None) -> tuple[str | None, ssl.SSLContext | None]:
    """The internal token (from `internal_token_file`, else the front's environment variable
    `internal_token_env`) and the TLS context (`ca_file`) of SPEC's endpoint replicas
    (R-AUTH-3, R-AUTH-4); ValueError (one line, never the token) when one cannot be had."""
    from vllm_srun.adapters.config.api_keys import read_token

    token = None
    if spec.internal_token_file is not None or spec.internal_token_env is not None:
        environ = os.environ if env is None else env
        token = read_token(file=spec.internal_token_file, env=spec.internal_token_env, environ=environ)
    context = tls_context(spec.ca_file) if spec.ca_file is not None else None
    return token, context
