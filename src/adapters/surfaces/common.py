"""What every surface shares: a request prepared into rows (`Prepared`), the result cache in front
of the forward, and `options.return_meta`.

A surface answers in two steps so that a bundle (`/v1/bundle`, R-PERF-1) can run the rows of
several requests in one submit: `prepare_*` validates and tokenizes a request into its rows
and a `finish` that turns the rows' outputs into the answer; `answer(prepared, …)` runs the
rows alone. Errors of the first step are raised before any row reaches a scheduler.

The CPU work of both steps (tokenizing, cutting windows, the cache key, building a large
answer) runs through `ServedModel.prepare`: on the event loop for a small request, on the
preparation pool for a large one (`adapters/offload.py`, R-API-9). A request's rows are held to
its model's `max_request_tokens` when it is prepared (413, before any forward).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import msgspec

from vllm_srun.adapters.request_timing import RequestTiming
from vllm_srun.adapters.schemas.common import CommonOptions
from vllm_srun.adapters.serving.scheduler_loop import ForwardStats
from vllm_srun.adapters.serving.served import GOLDEN_CHECK, Disconnected, ServedModel
from vllm_srun.domain.input_budget import InputBudget, in_force
from vllm_srun.domain.rows import RowSpec

R = TypeVar("R", bound=msgspec.Struct)
NO_FORWARD = ForwardStats((), 0.0, 0.0, 0, 0)
TOKENIZE_CHUNK = 64  # inputs tokenized at once: bounds a request's transient memory and when its budget stops it


def input_budget(served: ServedModel) -> InputBudget:
    """SERVED's input budget in force (`input: {max_tokens, overflow}`; none while the golden
    check replays its recorded requests, which were recorded without one)."""
    return in_force(InputBudget(served.args.input_max_tokens, served.args.input_overflow))


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
    cache_tag: str  # the surface's part of the cache key
    req: msgspec.Struct
    options: CommonOptions
    rows: Sequence[RowSpec]
    finish: Callable[[ForwardStats], R]
    polish: Callable[[R], R] = _same
    _key: Any = None

    def __post_init__(self) -> None:
        # every surface's rows, before any forward; the surfaces that tokenize in chunks already
        # stopped at the budget, this holds the others (decisions) and media rows to it too
        self.served.token_budget().spend(sum(row.tokens for row in self.rows))

    async def cached(self) -> R | None:
        """The answer from the result cache (no forward), or None."""
        served = self.served
        cache = served.cache
        if cache is None or not cache.enabled or not served.sha256 or GOLDEN_CHECK.get():
            return None
        # the input budget is part of the key: two names of the same weights may cut or refuse differently
        tag = input_budget(served).tag()
        self._key = await served.prepare(cache.key, served.sha256, self.cache_tag, self.req, tag)
        found: Any = cache.get(self._key, served.name)
        if found is None:
            return None
        meta = served.meta(None, 0) if self.options.return_meta else None
        hit: R = msgspec.structs.replace(found, model=served.name, meta=meta)
        return self.polish(hit)

    async def complete(self, stats: ForwardStats) -> R:
        """The answer from the rows' outputs: remembered in the cache, with meta when asked."""
        served = self.served
        response = await served.prepare(self.finish, stats)
        cache = served.cache
        if cache is not None and self._key is not None:
            await served.prepare(cache.put, self._key, response)
        if self.options.return_meta:
            response = msgspec.structs.replace(response, meta=served.meta(stats, len(self.rows)))
        return self.polish(response)


async def answer(prepared: Prepared[R], timing: RequestTiming | None, disconnected: Disconnected | None) -> R:
    """Answer one prepared request: from the result cache when it can, else its rows alone."""
    hit = await prepared.cached()
    if hit is not None:
        return hit
    if not prepared.rows:
        return await prepared.complete(NO_FORWARD)
    options = prepared.options
    stats = await prepared.served.run(
        prepared.rows, options.deadline_ms, timing, disconnected, priority=options.priority
    )
    return await prepared.complete(stats)
