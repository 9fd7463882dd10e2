"""The lifecycle of one replica: start its worker, probe its health, check its card, restart it
when it dies (R-REP-2, R-REP-4).

- Probes: `GET /health` every 0.5 s while starting, every 5 s once ready, 2 s timeout; an
  outlier event (`ProbeHealth`) probes at once. A ready replica is taken out after 3 failed
  probes in a row and comes back with the next good one; one that answers again but is still
  loading (503) is `starting` again rather than `failed`.
- A failed probe drops the replica's idle connections (an attached host that went away is
  reached again through fresh connections and a fresh name lookup).
- Ready: a 200 from /health, then its card from /v1/models, compared with the deployment
  (`compat.py`); the first compatible card becomes the pool's reference.
- Exit of a managed worker: noticed at once (`process.py`); the replica is `failed` and the
  worker is started again after 1 s, doubling to 60 s, reset after 60 s of stable running
  (`domain/fleet/restarts.py`); each start counts in `restarts`. A worker that refuses its
  arguments (status 2 before it was ever ready) is not restarted: the reason is final.
- A managed worker that has not answered /health for 60 s after it was ready is killed, and
  restarted like any crash (a SIGSTOPped worker that gets SIGCONT in time simply returns).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

import msgspec

from vllm_srun.adapters.config.schema import DeploymentConfig
from vllm_srun.adapters.workers.compat import card_problem, pick_card
from vllm_srun.adapters.workers.http_client import WorkerUnavailable
from vllm_srun.adapters.workers.process import WorkerProcess
from vllm_srun.adapters.workers.replica import ReplicaHandle
from vllm_srun.domain.fleet.restarts import RestartBackoff

log = logging.getLogger("vllm_srun.front.workers")

STARTING_PROBE_S = 0.5
READY_PROBE_S = 5.0
PROBE_TIMEOUT_S = 2.0
FAILED_PROBES = 3
UNRESPONSIVE_KILL_S = 60.0
REFUSED_STATUS = 2

EventSink = Callable[[str, ReplicaHandle, str], None]  # (event, replica, detail)


class DeploymentView(Protocol):
    name: str
    config: DeploymentConfig
    reference_card: dict[str, Any] | None


class ReplicaSupervisor:
    def __init__(
        self,
        handle: ReplicaHandle,
        deployment: DeploymentView,
        *,
        command: list[str] | None = None,
        env: dict[str, str] | None = None,
        on_event: EventSink = lambda event, handle, detail: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.handle = handle
        self.deployment = deployment
        self.command = command
        self.env = env
        self.on_event = on_event
        self.clock = clock
        self.backoff = RestartBackoff()
        self._stopping = False
        self._ready_once = False
        self._unresponsive_since: float | None = None
        self._unhealthy = False  # failed_reason says only that probes failed
        self._task: asyncio.Task[None] | None = None
        self._stopped = asyncio.Event()

    # ---- control -------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.ensure_future(self.run())
        self._task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("supervisor of %s stopped", self.handle.id, exc_info=task.exception())
            self.handle.record.mark_failed(f"supervisor error: {task.exception()!r}")

    async def stop(self, grace_s: float = 10.0) -> None:
        self._stopping = True
        self._stopped.set()
        self.handle.wake.set()
        process = self.handle.process
        if process is not None:
            await process.stop(grace_s)
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, PROBE_TIMEOUT_S + 1)
            except (TimeoutError, asyncio.CancelledError):
                self._task.cancel()
        self.handle.client.close_idle()

    # ---- the loop ------------------------------------------------------------------------
    async def run(self) -> None:
        handle, record = self.handle, self.handle.record
        while not self._stopping:
            if self.command is None:  # attached: nothing to start
                await self._watch(None)
                return
            process = handle.process = WorkerProcess(handle.id, self.command, env=self.env)
            self._ready_once = False
            try:
                await process.start()
            except OSError as exc:  # e.g. the interpreter vanished: retried like a crash
                code, reason = -1, f"cannot start the worker: {exc}"
                process.started_at = self.clock()
            else:
                self.on_event("replica_started", handle, f"pid={process.pid}")
                watched = await self._watch(process.exited)
                if self._stopping or watched is None:
                    return
                code, reason = watched, process.describe_exit(watched)
            handle.client.close_idle()
            if code == REFUSED_STATUS and not self._ready_once:
                record.mark_failed(f"{reason} (not restarted: the worker refused its arguments)")
                self.on_event("replica_failed", handle, record.failed_reason or reason)
                return
            delay = self.backoff.next_delay(process.started_at, self.clock())
            record.mark_failed(f"{reason}; restarting in {delay:g} s")
            self.on_event("replica_exited", handle, record.failed_reason or reason)
            try:
                await asyncio.wait_for(self._stopped.wait(), delay)
            except TimeoutError:
                pass
            if self._stopping:
                return
            record.mark_restarted()
            handle.card = None
            handle.probe_failures = 0
            self._unresponsive_since = None
            self.on_event("replica_restarted", handle, f"restarts={record.restarts}")

    async def _watch(self, exited: asyncio.Future[int] | None) -> int | None:
        """Probe until the process exits (its status) or the supervisor stops (None)."""
        handle = self.handle
        while not self._stopping:
            record = handle.record
            settled = record.ready or record.failed_reason is not None
            period = READY_PROBE_S if settled and handle.probe_failures == 0 else STARTING_PROBE_S
            woken = asyncio.ensure_future(handle.wake.wait())
            waits: set[asyncio.Future[Any]] = {woken}
            if exited is not None:
                waits.add(exited)
            await asyncio.wait(waits, timeout=period, return_when=asyncio.FIRST_COMPLETED)
            woken.cancel()
            handle.wake.clear()
            if exited is not None and exited.done():
                return exited.result()
            if self._stopping:
                return None
            await self._probe()
        return None

    # ---- probing -------------------------------------------------------------------------
    async def _probe(self) -> None:
        handle = self.handle
        try:
            response = await asyncio.wait_for(handle.client.request("GET", "/health"), PROBE_TIMEOUT_S)
        except TimeoutError:
            self._probe_failed(f"no answer within {PROBE_TIMEOUT_S:g} s")
            return
        except WorkerUnavailable as exc:
            self._probe_failed(str(exc))
            return
        if response.status == 200:
            await self._healthy()
            return
        status, reason = _health_reason(response.body)
        handle.probe_failures = 0
        self._unresponsive_since = None
        if self._unhealthy and status != "failed":  # it answers again (still loading): starting, not failed
            handle.record.failed_reason = None
            self._unhealthy = False
        if status == "failed":
            if handle.record.failed_reason is None:
                handle.record.mark_failed(reason or "the worker reports failed")
                self.on_event("replica_failed", handle, handle.record.failed_reason or "")
        elif handle.record.ready:  # was ready, now loading again: out of dispatch, not failed
            handle.record.ready = False

    def _probe_failed(self, error: str) -> None:
        handle, record = self.handle, self.handle.record
        handle.probe_failures += 1
        handle.last_probe_error = error
        handle.client.close_idle()  # they lead where the probe could not go; requests open fresh ones
        if handle.attached and handle.probe_failures == 1 and record.failed_reason is None:
            self.on_event("replica_unreachable", handle, error)  # once: the first failure of a streak
        starting = not self._ready_once and not handle.attached
        if starting:  # the socket is not there yet, or the worker is busy loading
            return
        now = self.clock()
        if self._unresponsive_since is None:
            self._unresponsive_since = now
        if handle.probe_failures >= FAILED_PROBES and record.failed_reason is None:
            record.mark_failed(f"not answering /health ({handle.probe_failures} probes): {error}")
            self._unhealthy = True
            self.on_event("replica_unhealthy", handle, record.failed_reason or error)
        process = handle.process
        if process is not None and process.running and now - self._unresponsive_since >= UNRESPONSIVE_KILL_S:
            self.on_event("replica_killed", handle, f"unresponsive for {UNRESPONSIVE_KILL_S:g} s")
            process.kill_now()

    async def _healthy(self) -> None:
        handle, record = self.handle, self.handle.record
        handle.probe_failures = 0
        handle.last_probe_error = None
        self._unresponsive_since = None
        self._unhealthy = False
        if record.ready and record.failed_reason is None:
            return  # serving (or known incompatible) already
        try:
            problem = await self._check_card()
        except _NoCard as exc:
            handle.last_probe_error = str(exc)
            return
        record.mark_ready()
        self._ready_once = True
        if problem is not None:
            record.mark_incompatible(problem)
            self.on_event("replica_incompatible", handle, problem)
            return
        record.mark_compatible()
        if self.deployment.reference_card is None:
            self.deployment.reference_card = handle.card
        self.on_event("replica_ready", handle, f"model={handle.worker_model}")

    async def _check_card(self) -> str | None:
        """Why the replica's card does not fit the deployment, or None; raises _NoCard when
        the card cannot be read now (the next probe tries again)."""
        handle = self.handle
        try:
            response = await asyncio.wait_for(handle.client.request("GET", "/v1/models"), PROBE_TIMEOUT_S)
            cards = msgspec.json.decode(response.body).get("data") if response.status == 200 else None
        except (TimeoutError, WorkerUnavailable, msgspec.DecodeError, AttributeError) as exc:
            raise _NoCard(f"cannot read its card from /v1/models: {exc or type(exc).__name__}") from None
        if not isinstance(cards, list):
            raise _NoCard(f"/v1/models answered {response.status} without a list of cards")
        card = pick_card(cards, handle.placement.model)
        if card is None:
            wanted = handle.placement.model or "exactly one model"
            return f"does not serve {wanted} (serves {', '.join(str(c.get('id')) for c in cards) or 'nothing'})"
        handle.card = card
        handle.worker_model = handle.placement.model or card.get("id")
        reference = self.deployment.reference_card
        return card_problem(card, self.deployment.config, None if reference is card else reference)


class _NoCard(Exception):
    """The card could not be read this time."""


def _health_reason(body: bytes) -> tuple[str | None, str | None]:
    """(overall status, first model's reason) of a worker's /health body."""
    try:
        doc = msgspec.json.decode(body)
        models = doc.get("models") or {}
        reasons = [m.get("reason") for m in models.values() if isinstance(m, dict) and m.get("reason")]
        return doc.get("status"), (reasons[0] if reasons else None)
    except (msgspec.DecodeError, AttributeError):
        return None, None
