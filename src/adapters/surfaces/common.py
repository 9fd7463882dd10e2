"""What every surface shares: the result cache in front of the forward, and `options.return_meta`."""

from __future__ import annotations

from typing import Any, Awaitable, Callable

import msgspec

from vllm_srun.adapters.schemas.common import ResponseMeta
from vllm_srun.adapters.serving.scheduler_loop import ForwardStats
from vllm_srun.adapters.serving.served import GOLDEN_CHECK, ServedModel

# compute() → (the answer without meta, the forward's outcome, rows it took)
Compute = Callable[[], Awaitable[tuple[msgspec.Struct, ForwardStats, int]]]


def hit_meta(served: ServedModel) -> ResponseMeta:
    model = served.model
    assert model is not None
    return ResponseMeta(numerics=model.numerics, dtype=model.dtype, device=model.device, engine=model.engine,
                 queue_ms=0.0, forward_ms=0.0, forwards=0, rows=0, padded_tokens=0, cache_hit=True)


async def answer(served: ServedModel, surface: str, req: Any, compute: Compute) -> Any:
    """Answer REQ from the result cache when it can (no forward), else compute and remember it."""
    options = getattr(req, "options", None)
    return_meta = bool(options is not None and options.return_meta)
    cache = served.cache
    key = None
    if cache is not None and cache.enabled and served.sha256 and not GOLDEN_CHECK.get():
        key = cache.key(served.sha256, surface, req)
        cached = cache.get(key, served.name)
        if cached is not None:
            return msgspec.structs.replace(cached, model=served.name, meta=hit_meta(served) if return_meta else None)
    response, outcome, rows = await compute()
    if key is not None:
        cache.put(key, response)  # type: ignore[union-attr]
    if return_meta:
        response = msgspec.structs.replace(response, meta=served.meta(outcome, rows))
    return response
