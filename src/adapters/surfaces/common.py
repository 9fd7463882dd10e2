"""What every surface shares: a request prepared into rows (`Prepared`), the result cache in front
of the forward, and `options.return_meta`.

A surface answers in two steps so that a bundle (`/v1/bundle`, R-PERF-1) can run the rows of
several requests in one submit: `prepare_*` validates and tokenizes a request into its rows
and a `finish` that turns the rows' outputs into the answer; `answer(prepared, …)` runs the
rows alone. Errors of the first step are raised before any row reaches a scheduler.
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
from vllm_srun.domain.rows import RowSpec

R = TypeVar("R", bound=msgspec.Struct)
NO_FORWARD = ForwardStats((), 0.0, 0.0, 0, 0)


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

    def cached(self) -> R | None:
        """The answer from the result cache (no forward), or None."""
        served = self.served
        cache = served.cache
        if cache is None or not cache.enabled or not served.sha256 or GOLDEN_CHECK.get():
            return None
        self._key = cache.key(served.sha256, self.cache_tag, self.req)
        found: Any = cache.get(self._key, served.name)
        if found is None:
            return None
        meta = served.meta(None, 0) if self.options.return_meta else None
        hit: R = msgspec.structs.replace(found, model=served.name, meta=meta)
        return self.polish(hit)

    def complete(self, stats: ForwardStats) -> R:
        """The answer from the rows' outputs: remembered in the cache, with meta when asked."""
        response = self.finish(stats)
        cache = self.served.cache
        if cache is not None and self._key is not None:
            cache.put(self._key, response)
        if self.options.return_meta:
            response = msgspec.structs.replace(response, meta=self.served.meta(stats, len(self.rows)))
        return self.polish(response)


async def answer(prepared: Prepared[R], timing: RequestTiming | None, disconnected: Disconnected | None) -> R:
    """Answer one prepared request: from the result cache when it can, else its rows alone."""
    hit = prepared.cached()
    if hit is not None:
        return hit
    if not prepared.rows:
        return prepared.complete(NO_FORWARD)
    stats = await prepared.served.run(prepared.rows, prepared.options.deadline_ms, timing, disconnected)
    return prepared.complete(stats)
