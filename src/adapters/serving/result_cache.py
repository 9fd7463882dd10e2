"""The worker's result cache (R-PERF-3): a bounded LRU (domain) of encoded answers, keyed by the
model's weights hash, the surface, what else decides the answer besides the request (the
deployment's input budget, `input: {max_tokens, overflow}`, and the profile it is answered under,
R-PROF-4) and the canonical request content.
Hits and misses are counted in `vllm_srun_result_cache_total{model,outcome}`.

Default: 1024 entries and at most 64 MiB of encoded answers (an answer over 8 MiB is not kept).
`--result-cache-entries 0` turns it off. Replicas (worker processes) keep independent caches.
"""

from __future__ import annotations

import hashlib
import threading
from typing import Any

import msgspec

from vllm_srun.domain.settings import bounds
from vllm_srun.domain.worker.cache import LruCache

# fields that never change an answer: which name it is asked by, who asks, how it is reported
_IGNORED = ("model", "user")
# ... and the profile, which the key holds resolved (the serving one where a request names none)
_IGNORED_OPTIONS = ("return_meta", "deadline_ms", "profile")


def canonical_request(req: msgspec.Struct) -> bytes:
    """The request's content with the answer-neutral fields left out, keys sorted."""
    body = msgspec.to_builtins(req)
    for name in _IGNORED:
        body.pop(name, None)
    options = body.pop("options", None)
    if options is not None:  # only the options that differ from their defaults
        defaults = msgspec.to_builtins(type(msgspec.structs.asdict(req)["options"])())
        changed = {f: v for f, v in options.items() if f not in _IGNORED_OPTIONS and v != defaults.get(f)}
        if changed:
            body["options"] = changed
    return msgspec.json.encode(body, order="sorted")


class ResultCache:
    def __init__(self, entries: int, counter: Any = None, *, max_bytes: int = bounds.RESULT_CACHE_BYTES) -> None:
        self._lru: LruCache[tuple[type, bytes]] = LruCache(
            entries, max_weight=max_bytes, max_entry_weight=max_bytes // 8
        )
        self._counter = counter
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self._lru.enabled

    @property
    def entries(self) -> int:
        return self._lru.capacity

    def __len__(self) -> int:
        return len(self._lru)

    @staticmethod
    def key(model_sha256: str, surface: str, req: msgspec.Struct, context: str = "") -> str:
        """The entry of REQ on SURFACE of these weights, under CONTEXT (what else decides the answer)."""
        digest = hashlib.sha256()
        for part in (model_sha256.encode(), surface.encode(), context.encode(), canonical_request(req)):
            digest.update(part)
            digest.update(b"\0")
        return digest.hexdigest()

    def get(self, key: str, model: str) -> Any | None:
        with self._lock:
            found = self._lru.get(key)
        if self._counter is not None:
            self._counter.inc({"model": model, "outcome": "hit" if found is not None else "miss"})
        if found is None:
            return None
        kind, blob = found
        return msgspec.msgpack.decode(blob, type=kind)

    def put(self, key: str, response: msgspec.Struct) -> bool:
        blob = msgspec.msgpack.encode(response)
        with self._lock:
            return self._lru.put(key, (type(response), blob), weight=len(blob))
