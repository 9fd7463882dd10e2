"""What every surface shares: a request prepared into rows (`Prepared`), the result cache in front
of the forward, and `options.return_meta`.

A surface answers in two steps so that a bundle (`/v1/bundle`, R-PERF-1) can run the rows of
several requests in one submit: `prepare_*` validates and tokenizes a request into its rows
and a `finish` that turns the rows' outputs into the answer; `answer(prepared, …)` runs the
rows alone. Errors of the first step are raised before any row reaches a scheduler.

An item (an input, a document) that cannot be answered fails in its own slot, its siblings
answered (R-API-10): an `ItemFailure` made while preparing (an over-long input, an input the
model cannot read) takes no row; a row whose deadline passed before it reached the device comes
back `EXPIRED` (`Prepared.expires_rows`: the surface's `finish` turns it into `deadline_exceeded`;
such an answer is never cached).

The CPU work of both steps (tokenizing, cutting windows, the cache key, building a large
answer) runs through `ServedModel.prepare`: on the event loop for a small request, on the
preparation pool for a large one (`adapters/offload.py`, R-API-9). A request's rows are held to
its model's `max_request_tokens` when it is prepared (413, before any forward).

Every surface is `async (served, request, call) -> response` (`surfaces/registry.py`), called
the same way by the HTTP app, the bundle's tasks and the golden check; the `Call`
(`adapters/call.py`) is the request's tenant, size, timing, disconnect and replay flag, and
`answer` gives it its options' priority and deadline.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

import msgspec

from vllm_srun.adapters.call import Call
from vllm_srun.adapters.model_card import answer_meta
from vllm_srun.adapters.schemas.common import CommonOptions, ItemErrorCode
from vllm_srun.adapters.serving.scheduler_loop import ForwardStats
from vllm_srun.adapters.serving.served import ServedModel
from vllm_srun.domain.inputs.input_budget import InputBudget, in_force
from vllm_srun.domain.scheduling.answers import EXPIRED
from vllm_srun.domain.scheduling.rows import RowSpec
from vllm_srun.domain.settings.profiles import Profile

R = TypeVar("R", bound=msgspec.Struct)
NO_FORWARD = ForwardStats((), 0.0, 0.0, 0, 0)
TOKENIZE_CHUNK = 64  # inputs tokenized at once: bounds a request's transient memory and when its budget stops it


def input_budget(served: ServedModel, call: Call) -> InputBudget:
    """SERVED's input budget in force for CALL (`input: {max_tokens, overflow}`; none for the
    golden check's replay of its recorded requests, which were recorded without one)."""
    return in_force(InputBudget(served.args.input_max_tokens, served.args.input_overflow), call.replay)


@dataclass(frozen=True, slots=True)
class ItemFailure:
    """Why one item has no result (the contract's `ItemError` code and a one-line message)."""

    code: ItemErrorCode
    message: str


def expired(index: int) -> ItemFailure:
    """The failure of item INDEX whose rows did not start before the request's deadline."""
    return ItemFailure("deadline_exceeded", f"item {index} was not started before options.deadline_ms")


def any_expired(outputs: Sequence[Any]) -> bool:
    return any(out is EXPIRED for out in outputs)


def _same(response: R) -> R:
    return response


@dataclass
class Prepared(Generic[R]):
    """One request, validated and tokenized: its rows and how their outputs become its answer.

    `finish(stats)` builds the answer without meta from the rows' outputs (`stats.outputs`, in
    row order); that answer is what the result cache keeps. `polish` shapes it for this
    request after the cache (e.g. rerank's `top_n`), on a hit as on a miss.
    """

    served: ServedModel
    call: Call  # the request it was prepared for (its size decides where its CPU work runs)
    cache_tag: str  # the surface's part of the cache key
    req: msgspec.Struct
    options: CommonOptions
    rows: Sequence[RowSpec]
    finish: Callable[[ForwardStats], R]
    polish: Callable[[R], R] = _same
    # `finish` answers an EXPIRED output (a row past its deadline) with its item's
    # `deadline_exceeded`; otherwise a passed deadline fails the whole request (504)
    expires_rows: bool = False
    _key: Any = None
    # the profile it is answered under (`options.profile`, else the serving one; R-PROF-4): 400
    # `invalid_request` here, before any row runs, when the model does not answer it
    profile: Profile = field(init=False)

    def __post_init__(self) -> None:
        self.profile = self.served.profile_for(self.options.profile)
        # every surface's rows, before any forward; the surfaces that tokenize in chunks already
        # stopped at the budget, this holds the others (decisions) and media rows to it too
        self.served.token_budget().spend(sum(row.tokens for row in self.rows))

    async def cached(self) -> R | None:
        """The answer from the result cache (no forward), or None."""
        served, call = self.served, self.call
        cache = served.cache
        if cache is None or not cache.enabled or not served.sha256 or call.replay:  # the golden check computes
            return None
        # the input budget is part of the key: two names of the same weights may cut or refuse differently
        tag = f"{input_budget(served, call).tag()}|profile={self.profile.name}"  # answers differ by profile
        self._key = await served.prepare(call, cache.key, served.sha256, self.cache_tag, self.req, tag)
        found: Any = cache.get(self._key, served.name)
        if found is None:
            return None
        meta = answer_meta(served, None, 0, self.profile) if self.options.return_meta else None
        hit: R = msgspec.structs.replace(found, model=served.name, meta=meta)
        return self.polish(hit)

    async def complete(self, stats: ForwardStats) -> R:
        """The answer from the rows' outputs: remembered in the cache, with meta when asked."""
        served, call = self.served, self.call
        response = await served.prepare(call, self.finish, stats)
        cache = served.cache
        if cache is not None and self._key is not None and not any_expired(stats.outputs):
            await served.prepare(call, cache.put, self._key, response)
        if self.options.return_meta:
            response = msgspec.structs.replace(response, meta=answer_meta(served, stats, len(self.rows), self.profile))
        return self.polish(response)


async def answer(prepared: Prepared[R]) -> R:
    """Answer one prepared request: from the result cache when it can, else its rows alone, at
    the priority and by the deadline its options ask for."""
    hit = await prepared.cached()
    if hit is not None:
        return hit
    if not prepared.rows:
        return await prepared.complete(NO_FORWARD)
    options = prepared.options
    stats = await prepared.served.run(
        prepared.rows,
        replace(prepared.call, priority=options.priority, deadline_ms=options.deadline_ms),
        profile=prepared.profile,
        expire_rows=prepared.expires_rows,
    )
    return await prepared.complete(stats)
