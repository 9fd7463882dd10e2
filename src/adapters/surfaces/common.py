"""What every surface shares: the result cache in front of the forward, and `options.return_meta`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgspec

from vllm_srun.adapters.schemas.common import CommonOptions
from vllm_srun.adapters.serving.scheduler_loop import ForwardStats
from vllm_srun.adapters.serving.served import GOLDEN_CHECK, ServedModel

R = TypeVar("R", bound=msgspec.Struct)
# compute() → (the answer without meta, the forward stats, rows it took)
Compute = Callable[[], Awaitable[tuple[R, ForwardStats, int]]]


async def answer(
    served: ServedModel, surface: str, req: msgspec.Struct, options: CommonOptions, compute: Compute[R]
) -> R:
    """Answer REQ from the result cache when it can (no forward), else compute and remember it."""
    cache = served.cache
    key = None
    if cache is not None and cache.enabled and served.sha256 and not GOLDEN_CHECK.get():
        key = cache.key(served.sha256, surface, req)
        cached: Any = cache.get(key, served.name)
        if cached is not None:
            meta = served.meta(None, 0) if options.return_meta else None
            hit: R = msgspec.structs.replace(cached, model=served.name, meta=meta)
            return hit
    response, stats, rows = await compute()
    if cache is not None and key is not None:
        cache.put(key, response)
    if options.return_meta:
        response = msgspec.structs.replace(response, meta=served.meta(stats, rows))
    return response
