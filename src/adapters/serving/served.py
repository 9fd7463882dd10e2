"""One served model as it serves (`ServedModel`): it admits a request's call (R-ADM-1), hands
the surfaces its loaded model and prepares their CPU work, runs a request's rows through its
scheduler loop and gives back their outputs (deadlines, disconnects, R-API-10).

What loading built for it to serve with is one immutable record (`model_setup.Serving`, made by
`loader.py`), replaced whole, never edited. What stays mutable here is what changes while it
lives: its lifecycle state and reason (`domain/worker/lifecycle`), the package it resolved to (folder
and hash, known before the load), the loaded model, the golden check's outcome and its running
scheduler loop. Its card and an answer's `meta` are wire shapes, built outside the serving core
(`adapters/model_card.py`).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from vllm_srun.adapters.call import Call, Disconnected, Held
from vllm_srun.adapters.cancellation import race
from vllm_srun.adapters.contracts import LoadedModel, MediaLoader
from vllm_srun.adapters.offload import Offload
from vllm_srun.adapters.serving.forward_threads import ForwardRunner
from vllm_srun.adapters.serving.model_setup import Serving
from vllm_srun.adapters.serving.package_facts import PackageFacts, package_facts
from vllm_srun.adapters.serving.result_cache import ResultCache
from vllm_srun.adapters.serving.scheduler_loop import ForwardStats, SchedulerLoop
from vllm_srun.domain.errors import DeadlineExceeded, NotReady, RequestTooLarge, UnsupportedSurface
from vllm_srun.domain.ports import Clock
from vllm_srun.domain.scheduling.admission import Admission
from vllm_srun.domain.scheduling.answers import EXPIRED
from vllm_srun.domain.scheduling.rows import RowSpec
from vllm_srun.domain.settings import bounds
from vllm_srun.domain.settings.engine_args import BatchingLimits, EngineArgs
from vllm_srun.domain.settings.profiles import PROFILES, Profile, enabled, profile_for, serving_profile
from vllm_srun.domain.worker.lifecycle import ModelState, advance

T = TypeVar("T")
ACCELERATORS = ("cpu", "cuda", "rocm", "mps")


def accelerator_of(device: str) -> str | None:
    """The accelerator kind of a device name (`cuda:1` → `cuda`); None for `auto` or a plugin's."""
    kind = device.split(":", 1)[0]
    return kind if kind in ACCELERATORS else None


class TokenBudget:
    """The tokens one request's rows may hold (`max_request_tokens`), spent as it is prepared:
    413 as soon as the total passes the limit, before the rest is tokenized or any row runs."""

    def __init__(self, limit: int, model: str) -> None:
        self.limit = limit
        self.model = model
        self.spent = 0

    def spend(self, tokens: int) -> None:
        self.spent += tokens
        if self.spent > self.limit:
            raise RequestTooLarge(
                f"the request needs more than {self.limit} tokens (max_request_tokens of model {self.model!r}); "
                "send fewer or shorter inputs"
            )


async def until_deadlines(
    rows: Sequence[RowSpec],
    deadline_ms: float | Sequence[float | None] | None,
    spent: float,
    submit: Callable[[list[RowSpec], list[float | None]], Awaitable[ForwardStats]],
    disconnected: Disconnected | None,
) -> ForwardStats:
    """ROWS run by SUBMIT(rows, seconds each may wait) with their deadlines (DEADLINE_MS: one for
    all, or one per row; ms since the request arrived, SPENT seconds ago): a row whose deadline
    passed already is not submitted, and every row not started by its deadline answers `EXPIRED`
    (R-API-10). A client that goes away cancels them (`race`)."""
    per_row = list(deadline_ms) if isinstance(deadline_ms, Sequence) else [deadline_ms] * len(rows)
    left = [None if ms is None else ms / 1000 - spent for ms in per_row]
    live = [i for i, seconds in enumerate(left) if seconds is None or seconds > 0]
    if not live:
        return ForwardStats((EXPIRED,) * len(rows), 0.0, 0.0, 0, 0)
    stats = await race(
        lambda: submit([rows[i] for i in live], [left[i] for i in live]),
        deadline_s=None,
        disconnected=disconnected,
        deadline_message="",
    )
    if len(live) == len(rows):
        return stats
    outputs: list[Any] = [EXPIRED] * len(rows)
    for at, i in enumerate(live):
        outputs[i] = stats.outputs[at]
    return replace(stats, outputs=tuple(outputs))


def _pending_golden() -> dict[str, Any]:
    return {"status": "pending", "checked": 0, "matched": 0, "reason": None}


@dataclass
class ServedModel:
    name: str
    artifact: str
    args: EngineArgs
    device: str
    engine: str = bounds.ENGINE.default  # `--engine` or its models file entry's: a plugin's name, or auto
    cache: ResultCache | None = None  # the worker's result cache (R-PERF-3), shared by its models
    status: ModelState = ModelState.STARTING  # its step in `domain/worker/lifecycle` (only `become` changes it)
    reason: str | None = None
    folder: Path | None = None
    model: LoadedModel | None = None
    scheduler_loop: SchedulerLoop | None = None
    serving: Serving | None = None  # what loading built for it to serve with
    sha256: str | None = None
    golden: dict[str, Any] = field(default_factory=_pending_golden)
    admission: Admission | None = None  # R-ADM-1: its unanswered requests and tokens
    clock: Clock | None = None
    max_request_tokens: int = bounds.MAX_REQUEST_TOKENS.default
    offload: Offload | None = None  # where large requests are prepared (None: on the loop)
    # a models file entry's upstream fields (`ModelSpec`): the Hub commit asked for, the family
    # forced, the memory budget and the family's options
    revision: str | None = None
    family: str | None = None
    memory_budget_gib: float | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    _facts: PackageFacts | None = field(default=None, init=False, repr=False)  # read once, from `folder`

    @property
    def limits(self) -> BatchingLimits | None:
        return self.serving.limits if self.serving is not None else None

    @property
    def media(self) -> MediaLoader | None:
        return self.serving.media if self.serving is not None else None

    @property
    def forward_runner(self) -> ForwardRunner | None:
        forwards = self.serving.forwards if self.serving is not None else None
        return forwards.runner if forwards is not None else None

    @property
    def target(self) -> str:
        """What the model store resolves: the artifact, at its Hub revision when it has one."""
        return f"{self.artifact}@{self.revision}" if self.revision else self.artifact

    @property
    def ready(self) -> bool:
        return self.status is ModelState.READY

    def become(self, state: ModelState, reason: str | None = None) -> None:
        """Take a step of the lifecycle (IllegalTransition: one it does not allow); REASON: why it failed."""
        self.status = advance(self.status, state)
        if reason is not None:
            self.reason = reason

    @contextmanager
    def admitted(self, call: Call, requests: int, tokens: int) -> Iterator[Call]:
        """Hold REQUESTS requests of TOKENS (an upper bound) for CALL's tenant until the block
        ends, or raise `Overloaded` (R-ADM-1, R-FAIR-4); the block gets CALL holding the ticket.
        Leaving the block normally counts them as answered work. Rows it runs (`run`) are
        scheduled for its tenant (R-FAIR-1), and from the first of them on the ticket holds their
        counted tokens instead of the bound."""
        admission, clock = self.admission, self.clock
        if admission is None or clock is None:
            yield call
            return
        ticket = admission.admit(requests, tokens, clock.now(), call.tenant)
        answered = False
        try:
            yield replace(call, held=Held(admission, ticket))
            answered = True
        finally:
            admission.release(ticket, clock.now(), answered=answered)

    def require_surface(self, surface: str, call: Call) -> LoadedModel:
        """The model, when it is ready (or warming and CALL is its golden check's replay) and lists SURFACE."""
        checking = self.status is ModelState.WARMING and call.replay
        if self.model is None or not (self.ready or checking):
            raise NotReady(f"model {self.name!r} is {self.status}" + (f": {self.reason}" if self.reason else ""))
        if surface not in self.model.surfaces:
            raise UnsupportedSurface(
                f"model {self.name!r} does not serve {surface} (it serves {', '.join(sorted(self.model.surfaces))})"
            )
        return self.model

    async def prepare(self, call: Call, fn: Callable[..., T], *args: Any) -> T:
        """FN(*ARGS), the CPU work of preparing CALL's request: off the event loop when it is large."""
        return fn(*args) if self.offload is None else await self.offload.hand_off(fn, *args, size=call.body_bytes)

    def token_budget(self) -> TokenBudget:
        return TokenBudget(self.max_request_tokens, self.name)

    async def run(
        self,
        rows: Sequence[RowSpec],
        call: Call,
        *,
        profile: Profile | None = None,
        expire_rows: bool = False,
        row_deadlines: Sequence[float | None] | None = None,
    ) -> ForwardStats:
        """The rows' outputs once CALL's last row ran; drops them on its deadline or disconnect.
        Its tenant and priority (None: the scheduler's choice, interactive unless the rows are
        more than one forward) decide when its rows run among the others' (R-FAIR-2/3). PROFILE
        (None: the serving one) decides whether its rows may share forwards with other requests'
        rows (R-PROF-2). Its deadline counts from its arrival. EXPIRE_ROWS (R-API-10): the deadline
        fails nothing; a row not started by it (ROW_DEADLINES: one per row instead, in ms from the
        arrival) is not run and its output is `EXPIRED`. Without it a passed deadline fails the
        whole request (`DeadlineExceeded`, 504)."""
        loop = self.scheduler_loop
        assert loop is not None
        timing = call.timing
        if timing is not None and not timing.run_start:  # the end of its `tokenize` phase
            timing.run_start = time.perf_counter()
        held = call.held
        if held is not None and held.admission is self.admission:  # its real tokens, no longer the body's bound
            held.admission.count_rows(held.ticket, sum(spec.tokens for spec in rows))
        exact = not (profile or self.profile).coalesces
        if expire_rows:
            spent = time.perf_counter() - timing.start if timing is not None else 0.0
            deadline_ms = call.deadline_ms if row_deadlines is None else row_deadlines
            stats = await until_deadlines(
                rows,
                deadline_ms,
                spent,
                lambda live, seconds: loop.submit(live, call, exact=exact, deadlines=seconds),
                call.disconnected,
            )
            if timing is not None:
                timing.queue_ms = stats.queue_s * 1000
                timing.forward_ms = stats.forward_s * 1000
            return stats
        assert row_deadlines is None, "a deadline per row needs expire_rows"
        deadline_ms, deadline_s = call.deadline_ms, None
        if deadline_ms is not None:  # counted from the request's arrival: its preparation took part of it
            spent = time.perf_counter() - timing.start if timing is not None else 0.0
            deadline_s = deadline_ms / 1000 - spent
            if deadline_s <= 0:
                raise DeadlineExceeded(f"no answer within options.deadline_ms={deadline_ms:g} (spent preparing it)")
        stats = await race(
            lambda: loop.submit(rows, call, exact=exact),
            deadline_s=deadline_s,
            disconnected=call.disconnected,
            deadline_message=f"no answer within options.deadline_ms={deadline_ms:g}" if deadline_ms else "",
        )
        if timing is not None:  # a bundle's models each set them: the last answered's stay
            timing.queue_ms = stats.queue_s * 1000
            timing.forward_ms = stats.forward_s * 1000
            timing.run_end = time.perf_counter()  # its `post` phase starts
        return stats

    @property
    def facts(self) -> PackageFacts | None:
        """The package's manifest hash, origin and weight count (`package_facts.py`), once resolved."""
        if self._facts is None and self.folder is not None:
            self._facts = package_facts(self.folder, self.artifact)
        return self._facts

    @property
    def accelerator(self) -> str | None:
        """The accelerator the model runs on (`cpu`, `cuda`, `rocm`, `mps`): its device's kind."""
        return self.model.device.kind if self.model is not None else accelerator_of(self.device)

    @property
    def profile(self) -> Profile:
        """The profile the model serves (R-PROF-3): settled at its load (an unset profile becomes
        max_speed where `--dtype` asks for another precision), else the one its settings ask for."""
        if self.serving is not None and self.serving.profile is not None:
            return self.serving.profile
        try:
            return serving_profile(self.args.profile, self.args.enable_shared_context)
        except ValueError:  # refused before any load (`ModelArgs.problems`); exact until then
            return PROFILES["exact"]

    @property
    def profiles(self) -> tuple[Profile, ...]:
        """The profiles a request may ask for (R-PROF-4): exact, then the serving one."""
        return enabled(self.profile, self.serving is None or self.serving.published)

    def profile_for(self, asked: str | None) -> Profile:
        """A request's profile (`options.profile`; None: the serving one); 400 `invalid_request`
        naming the enabled ones for any other name (R-PROF-4)."""
        return profile_for(asked, self.profile, self.serving is None or self.serving.published)

    def profile_fields(self) -> dict[str, Any]:
        """The card's `profile` (the serving one) and `profiles` (the enabled ones, R-PROF)."""
        return {"profile": self.profile.name, "profiles": [p.card() for p in self.profiles]}
