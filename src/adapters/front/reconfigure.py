"""Live reconfiguration of the front (R-REP-2; seed 004): on SIGHUP (or `vllm-sr reload`) the
config is read again and applied without failing a request.

1. Read and validate: the file and the same flags as at start, the workers' settings, the
   packages. A refused config changes nothing: the old one keeps serving, and the status says
   why (one line per problem).
2. Prepare: start the new workers (`Fleet.plan` keeps every worker whose deployment and
   placement did not change, so those are not restarted) and wait until each is ready and
   compatible. A new worker that fails, is incompatible or is not ready within
   `READY_TIMEOUT_S` aborts the reload: the new workers stop and the old pool keeps serving.
3. Publish the new deployments at once (`Fleet.publish`): from then on requests go to the
   new pools.
4. Retire: a worker no deployment keeps takes no new request and finishes those it holds
   (at most its deployment's timeout), then stops.

Reloads run one at a time; a signal that arrives during one runs another after it. The
latest reload's outcome is in the inventory (`reload`), where `vllm-sr reload` reads it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vllm_srun.adapters.config.schema import ConfigError, FrontConfig
from vllm_srun.adapters.front.fleet import Fleet
from vllm_srun.adapters.workers.supervisor import ReplicaSupervisor

log = logging.getLogger("vllm_srun.front")

READY_TIMEOUT_S = 300.0
RETIRE_MARGIN_S = 5.0  # past the deployment's timeout_ms, a retired worker stops anyway
POLL_S = 0.1

LoadConfig = Callable[[], FrontConfig]  # raises ConfigError, or ValueError/OSError with one line
CheckConfig = Callable[[FrontConfig], None]  # refusals that need the packages; raises ValueError


@dataclass
class ReloadStatus:
    generation: int = 0  # reloads begun since the front started
    state: str = "none"  # none | running | done | refused | failed
    problems: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    started: list[str] = field(default_factory=list)
    retired: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def describe(self) -> dict[str, Any]:
        return {
            "generation": self.generation,
            "state": self.state,
            "problems": list(self.problems),
            "kept": list(self.kept),
            "started": list(self.started),
            "retired": list(self.retired),
            "seconds": round(self.seconds, 3),
        }


class Reconfigurer:
    def __init__(
        self,
        fleet: Fleet,
        *,
        load: LoadConfig,
        check: CheckConfig = lambda config: None,
        ready_timeout_s: float = READY_TIMEOUT_S,
    ) -> None:
        self.fleet = fleet
        self.load = load
        self.check = check
        self.ready_timeout_s = ready_timeout_s
        self.status = ReloadStatus()
        self._task: asyncio.Task[None] | None = None
        self._again = False
        self._retirements: set[asyncio.Task[None]] = set()

    def request(self) -> None:
        """Reload soon (a signal handler calls this): now, or after the reload under way."""
        if self._task is not None and not self._task.done():
            self._again = True
            return
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while True:
            self._again = False
            await self.reload()
            if not self._again:
                return

    async def reload(self) -> ReloadStatus:
        status = self.status = ReloadStatus(generation=self.status.generation + 1, state="running")
        began = time.monotonic()
        log.warning("reload %d: reading the config again", status.generation)
        try:
            await self._reload(status)
        finally:
            status.seconds = time.monotonic() - began
            if status.state == "running":  # cancelled (the front is stopping)
                status.state = "failed"
                status.problems = ["the front stopped during the reload"]
        if status.state == "done":
            log.warning(
                "reload %d done in %.1f s: kept %s, started %s, retired %s",
                status.generation,
                status.seconds,
                status.kept or "none",
                status.started or "none",
                status.retired or "none",
            )
        else:
            for problem in status.problems:
                log.error("reload %d %s (the old config keeps serving): %s", status.generation, status.state, problem)
        return status

    async def _reload(self, status: ReloadStatus) -> None:
        try:
            config = self.load()
            self.check(config)
            plans = self.fleet.plan(config)
        except ConfigError as exc:
            status.state, status.problems = "refused", list(exc.problems)
            return
        except (ValueError, OSError) as exc:
            status.state, status.problems = "refused", [str(exc)]
            return
        started = [supervisor for plan in plans.values() for supervisor in plan.started]
        problem = await self._bring_up(started)
        if problem is not None:
            status.state, status.problems = "failed", [problem]
            await asyncio.gather(*(s.stop() for s in started), return_exceptions=True)
            for supervisor in started:
                if supervisor in self.fleet.preparing:
                    self.fleet.preparing.remove(supervisor)
            return
        retired = self.fleet.publish(config, plans)
        status.state = "done"
        status.kept = [s.handle.id for plan in plans.values() for s in plan.kept]
        status.started = [s.handle.id for s in started]
        status.retired = [s.handle.id for s in retired]
        timeouts = {name: d.timeout_s for name, d in self.fleet.deployments.items()}
        for supervisor in retired:
            wait_s = timeouts.get(supervisor.handle.deployment, max(timeouts.values(), default=60.0))
            task = asyncio.ensure_future(self.fleet.retire(supervisor, wait_s + RETIRE_MARGIN_S))
            self._retirements.add(task)
            task.add_done_callback(self._retirements.discard)

    async def _bring_up(self, started: list[ReplicaSupervisor]) -> str | None:
        """Start the new workers and wait until each is ready and compatible; why not, or None."""
        self.fleet.preparing.extend(started)
        for supervisor in started:
            supervisor.start()
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            for supervisor in started:
                record = supervisor.handle.record
                if record.failed_reason is not None:
                    return f"replica {record.id} failed: {record.failed_reason}"
                if record.incompatible_reason is not None:
                    return f"replica {record.id} is incompatible: {record.incompatible_reason}"
            if all(supervisor.handle.record.up for supervisor in started):
                return None
            if time.monotonic() > deadline:
                waiting = [s.handle.id for s in started if not s.handle.record.up]
                return f"replicas {', '.join(waiting)} not ready within {self.ready_timeout_s:g} s"
            await asyncio.sleep(POLL_S)
