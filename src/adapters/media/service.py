"""The worker's `MediaLoader` (R-MEDIA, R-PERF-4): decoding off the event loop, once per content.

- `--media-workers N` (N ≥ 1): jobs go to N media worker processes (`pool.py`), started when a
  model that reads media loads; `0`: the decoder runs in a thread of the request path. The same
  decoder code runs either way, so the pixels are identical.
- Decode once: the preprocessed pixels (audio: features; a vision-language model's video: a
  `SampledVideo`, pixels and frame times) are kept in a bounded LRU (entries and bytes) keyed by
  the SHA-256 of the bytes, the kind (image, video and its frame count, a clip, or audio and its
  declared format), the limits and the preprocessing. Concurrent requests for the same content
  share one decode. Bad media is not cached. Cached arrays are read-only.
- `/metrics`: lookups (`vllm_srun_media_decode_cache_total{outcome}`), entries and bytes
  (gauges), decode seconds by kind, worker replacements.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from collections.abc import Hashable
from functools import partial
from typing import Any

import numpy as np

from vllm_srun.adapters.contracts.media import (
    AudioJob,
    ClipJob,
    ImageJob,
    MediaDecoder,
    MediaJob,
    MediaLimits,
    PixelSpec,
    SampledVideo,
    VideoJob,
    decode,
)
from vllm_srun.adapters.media.pool import DEFAULT_DECODER, MediaWorkerPool
from vllm_srun.adapters.media.worker import load_decoder
from vllm_srun.domain.inputs.media import DECODE_CACHE_BYTES, DECODE_CACHE_ENTRIES
from vllm_srun.domain.worker.cache import LruCache

Decoded = np.ndarray | SampledVideo  # what the cache keeps: pixels (features), or a sampled clip


def _read_only(decoded: Any) -> Decoded:
    """DECODED as float32 and read-only (a clip's pixels likewise)."""
    if isinstance(decoded, SampledVideo):
        return SampledVideo(_read_only(decoded.pixels), tuple(decoded.times))  # type: ignore[arg-type]
    pixels = np.asarray(decoded, dtype=np.float32)
    pixels.setflags(write=False)
    return pixels


class MediaService:
    def __init__(
        self,
        workers: int,
        *,
        decoder: str = DEFAULT_DECODER,
        cache_entries: int = DECODE_CACHE_ENTRIES,
        cache_bytes: int = DECODE_CACHE_BYTES,
        metrics: Any = None,
        workers_source: str = "set",
        env: dict[str, str] | None = None,
    ) -> None:
        if workers < 0:
            raise ValueError("media workers must be >= 0")
        self.workers = workers
        self.workers_source = workers_source
        self.decoder_path = decoder
        replaced = (lambda why: metrics.media_workers_replaced.inc({"reason": why})) if metrics is not None else None
        self._pool = MediaWorkerPool(workers, decoder, env=env, on_replaced=replaced) if workers > 0 else None
        self._inline: MediaDecoder | None = None
        self._cache: LruCache[Decoded] = LruCache(cache_entries, max_weight=cache_bytes)
        self._lock = threading.Lock()
        self._inflight: dict[Hashable, asyncio.Future[Decoded]] = {}
        self._metrics = metrics
        self.hits = 0  # cache hits, a decode shared with a concurrent request included
        self.misses = 0

    # ---- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        """Start decoding (when a model that reads media loads): the workers, the cache gauges."""
        if self._metrics is not None:
            for kind in ("image", "video", "audio"):
                self._metrics.media_cache_entries.set_function(partial(self._held, kind, False), {"kind": kind})
                self._metrics.media_cache_bytes.set_function(partial(self._held, kind, True), {"kind": kind})
        if self._pool is not None:
            self._pool.start()
        elif self._inline is None:
            self._inline = load_decoder(self.decoder_path)

    async def stop(self) -> None:
        if self._pool is not None:
            await asyncio.to_thread(self._pool.stop)

    # ---- decoding -------------------------------------------------------------------------
    async def image(self, data: bytes, limits: MediaLimits, preprocess: PixelSpec) -> np.ndarray:
        key = ("image", hashlib.sha256(data).digest(), limits, preprocess)
        return await self._once(key, ImageJob(data, limits, preprocess))

    async def video(self, data: bytes, frames: int, limits: MediaLimits, preprocess: PixelSpec) -> np.ndarray:
        key = ("video", hashlib.sha256(data).digest(), frames, limits, preprocess)
        return await self._once(key, VideoJob(data, frames, limits, preprocess))

    async def clip(self, data: bytes, limits: MediaLimits, preprocess: PixelSpec) -> SampledVideo:
        key = ("video", hashlib.sha256(data).digest(), "clip", limits, preprocess)
        found = await self._once(key, ClipJob(data, limits, preprocess))
        assert isinstance(found, SampledVideo)
        return found

    async def audio(self, data: bytes, fmt: str, limits: MediaLimits, preprocess: PixelSpec) -> np.ndarray:
        key = ("audio", hashlib.sha256(data).digest(), fmt, limits, preprocess)
        return await self._once(key, AudioJob(data, fmt, limits, preprocess))

    async def _once(self, key: Hashable, job: MediaJob) -> Any:
        kind = job.kind
        with self._lock:
            found = self._cache.get(key)
        if found is not None:
            self._count(kind, "hit")
            return found
        pending = self._inflight.get(key)
        if pending is not None:  # the same content is being decoded for another request
            self._count(kind, "hit")
            return await asyncio.shield(pending)
        self._count(kind, "miss")
        task = asyncio.ensure_future(self._decode(key, job))
        self._inflight[key] = task
        task.add_done_callback(lambda _: self._inflight.pop(key, None))
        return await asyncio.shield(task)

    async def _decode(self, key: Hashable, job: MediaJob) -> Decoded:
        started = time.perf_counter()
        if self._pool is not None:
            decoded = await self._pool.run(job)
        else:
            if self._inline is None:
                self.start()
            assert self._inline is not None
            decoded = await asyncio.to_thread(decode, self._inline, job)
        kept = _read_only(decoded)
        if self._metrics is not None:
            self._metrics.media_decode_seconds.observe(time.perf_counter() - started, {"kind": job.kind})
        with self._lock:
            self._cache.put(key, kept, weight=kept.nbytes)
        return kept

    def _held(self, kind: str, weighed: bool) -> float:
        """Entries (or their bytes) of KIND in the cache."""
        with self._lock:
            held = [weight for key, weight in self._cache.weights() if isinstance(key, tuple) and key[0] == kind]
        return float(sum(held) if weighed else len(held))

    def _count(self, kind: str, outcome: str) -> None:
        if outcome == "hit":
            self.hits += 1
        else:
            self.misses += 1
        if self._metrics is not None:
            self._metrics.media_cache.inc({"kind": kind, "outcome": outcome})

    # ---- reports --------------------------------------------------------------------------
    @property
    def replaced(self) -> int:
        return self._pool.replaced if self._pool is not None else 0

    def pids(self) -> list[int]:
        return self._pool.pids() if self._pool is not None else []

    def card(self) -> dict[str, Any]:
        return {
            "workers": self.workers,
            "workers_source": self.workers_source,
            "decoding": "worker processes" if self._pool is not None else "request path (a thread)",
            "worker_pids": self.pids(),
            "workers_replaced": self.replaced,
            "decode_cache": {
                "entries": len(self._cache),
                "max_entries": self._cache.capacity,
                "bytes": self._cache.weight,
                "max_bytes": self._cache.max_weight,
                "hits": self.hits,
                "misses": self.misses,
            },
        }
