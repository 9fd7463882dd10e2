"""Media workers (R-MEDIA) and decode once (R-PERF-4), with real worker processes.

- `--media-workers N` and `0` give the same pixels, bit for bit (the real decoder);
- a worker that dies (or overruns its time) holding a job fails that job only, with a clear
  error, and a new process takes its place; other jobs in flight are unaffected;
- repeated content is decoded once (content hash), concurrent requests for the same content
  share one decode, the cache is bounded in entries and bytes, bad media is not kept.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.fake_media import FakeDecoder
from tests.prometheus_text import metric
from tests.waiting import until
from vllm_srun.adapters.contracts import ImageJob, MediaError, MediaLimits, MediaWorkerDied
from vllm_srun.adapters.media.pool import MediaWorkerPool
from vllm_srun.adapters.media.preprocess import ImagePreprocess
from vllm_srun.adapters.media.samples import image_bytes, video_bytes
from vllm_srun.adapters.media.service import MediaService
from vllm_srun.adapters.serving.metrics import RuntimeMetrics
from vllm_srun.domain.inputs import media

FAKE = "tests.fake_media:FakeDecoder"
IMAGE = MediaLimits(max_bytes=media.IMAGE_MAX_BYTES, max_pixels=media.IMAGE_MAX_PIXELS)
VIDEO = MediaLimits(
    max_bytes=media.VIDEO_MAX_BYTES,
    max_pixels=media.VIDEO_MAX_FRAME_PIXELS,
    max_frames=32,
    max_duration_s=60,
    max_decoded_frames=2000,
)
CLIP = ImagePreprocess.from_config({}, "clip")
SIGLIP = ImagePreprocess.from_config({"size": {"height": 64, "width": 64}}, "siglip")


async def _decode_all(service: MediaService) -> list[np.ndarray]:
    shapes = [(300, 200, "RGB", "JPEG"), (64, 640, "RGBA", "PNG"), (97, 31, "P", "GIF"), (50, 50, "CMYK", "JPEG")]
    jobs = [
        service.image(image_bytes(seed, w, h, mode=mode, fmt=fmt), IMAGE, spec)
        for seed, (w, h, mode, fmt) in enumerate(shapes)
        for spec in (CLIP, SIGLIP)
    ]
    jobs += [service.video(video_bytes(seed, 9, 64, 48), 5, VIDEO, SIGLIP) for seed in range(2)]
    return list(await asyncio.gather(*jobs))


def test_the_pixels_are_identical_with_media_workers_and_without() -> None:
    async def run(workers: int) -> list[np.ndarray]:
        service = MediaService(workers, cache_entries=0)
        await asyncio.to_thread(service.start)
        try:
            return await _decode_all(service)
        finally:
            await service.stop()

    inline, pooled = asyncio.run(run(0)), asyncio.run(run(2))
    assert len(inline) == len(pooled) == 10
    for a, b in zip(inline, pooled):
        assert a.dtype == b.dtype == np.float32 and a.shape == b.shape and a.tobytes() == b.tobytes()


def test_a_worker_that_dies_fails_only_its_job_and_is_replaced() -> None:
    async def run() -> None:
        pool = MediaWorkerPool(2, FAKE)
        await asyncio.to_thread(pool.start)
        first = pool.pids()
        try:
            slow = [pool.run(ImageJob(f"sleep:0.3;{i}".encode(), IMAGE, None)) for i in range(3)]
            results = await asyncio.gather(pool.run(ImageJob(b"exit", IMAGE, None)), *slow, return_exceptions=True)
            died = results[0]
            assert isinstance(died, MediaWorkerDied) and died.reason == "exited"
            assert "exited with status 3" in str(died) and "replaced" in str(died)
            for i, got in enumerate(results[1:]):
                assert isinstance(got, np.ndarray), got
                assert np.array_equal(got, FakeDecoder().image(f"sleep:0.3;{i}".encode(), IMAGE, None))
            # a new process took the dead one's place; every later job is answered
            again = await asyncio.gather(*(pool.run(ImageJob(bytes([i]), IMAGE, None)) for i in range(6)))
            assert len(again) == 6 and pool.replaced == 1
            assert len(pool.pids()) == 2 and pool.pids() != first
        finally:
            pool.stop()

    asyncio.run(run())


def test_a_worker_killed_from_outside_or_over_its_time_fails_its_job_only(tmp_path: Path) -> None:
    async def run() -> None:
        replaced: list[str] = []
        pool = MediaWorkerPool(1, FAKE, job_timeout_s=1.0, on_replaced=replaced.append)
        await asyncio.to_thread(pool.start)
        try:
            job = asyncio.ensure_future(
                pool.run(ImageJob(f"sleep:5;mark:{tmp_path / 'taken'};killed".encode(), IMAGE, None))
            )
            await until((tmp_path / "taken").exists, what="the job in the worker")
            os.kill(pool.pids()[0], signal.SIGKILL)
            with pytest.raises(MediaWorkerDied, match="exited with status -9"):
                await job
            started = time.monotonic()
            with pytest.raises(MediaWorkerDied, match="took over 1 s") as caught:
                await pool.run(ImageJob(b"sleep:30;stuck", IMAGE, None))
            assert caught.value.reason == "timeout" and time.monotonic() - started < 10
            with pytest.raises(MediaError, match="bad fake media"):  # bad media: the worker stays
                await pool.run(ImageJob(b"bad", IMAGE, None))
            assert (await pool.run(ImageJob(b"ok", IMAGE, None))).shape == (3, 4, 4)
            assert replaced == ["exited", "timeout"]
        finally:
            pool.stop()

    asyncio.run(run())


def test_repeated_media_is_decoded_once_and_the_cache_is_bounded() -> None:
    async def run() -> None:
        metrics = RuntimeMetrics()
        service = MediaService(1, decoder=FAKE, cache_entries=3, cache_bytes=10 * 192, metrics=metrics)
        await asyncio.to_thread(service.start)
        try:
            same = [service.image(b"sleep:0.2;same", IMAGE, None) for _ in range(5)]
            got = await asyncio.gather(*same)
            assert all(g is got[0] for g in got) and not got[0].flags.writeable
            assert (service.misses, service.hits) == (1, 4)  # one decode shared by five requests
            assert await service.image(b"sleep:0.2;same", IMAGE, None) is got[0]  # then from the cache
            assert service.hits == 5
            for i in range(4):  # 3 entries at most: the oldest leave
                await service.image(bytes([i]), IMAGE, None)
            card = service.card()["decode_cache"]
            assert card["entries"] == 3 and card["bytes"] == 3 * 192 and card["max_entries"] == 3
            with pytest.raises(MediaError):
                await service.image(b"bad", IMAGE, None)
            with pytest.raises(MediaError):  # not kept: decoded (and refused) again
                await service.image(b"bad", IMAGE, None)
            assert service.card()["decode_cache"]["entries"] == 3
            video = await service.video(b"v", 4, VIDEO, None)
            assert video.shape == (4, 3, 4, 4) and (await service.video(b"v", 2, VIDEO, None)).shape == (2, 3, 4, 4)
            text = metrics.render()
            assert 'vllm_srun_media_decode_cache_total{kind="image",outcome="hit"} 5.0' in text
            # 3 entries at most: two videos (4 and 2 frames) and the newest image
            assert 'vllm_srun_media_decode_cache_entries{kind="image"} 1.0' in text
            assert 'vllm_srun_media_decode_cache_entries{kind="video"} 2.0' in text
            assert 'vllm_srun_media_decode_cache_bytes{kind="video"} 1152.0' in text
            assert 'vllm_srun_media_decode_duration_seconds_count{kind="image"}' in text
        finally:
            await service.stop()

    asyncio.run(run())


def test_bytes_bound_the_cache_too() -> None:
    async def run() -> None:
        service = MediaService(0, decoder=FAKE, cache_entries=100, cache_bytes=2 * 192)
        for i in range(5):
            await service.image(bytes([i]), IMAGE, None)
        assert service.card()["decode_cache"] | {"hits": 0} == {
            "entries": 2,
            "max_entries": 100,
            "bytes": 384,
            "max_bytes": 384,
            "hits": 0,
            "misses": 5,
        }

    asyncio.run(run())


def test_a_request_whose_media_worker_dies_fails_alone(multimodal_fixture: Callable[..., Path]) -> None:
    """Served in-process with one real media worker running the fake decoder: the request whose
    image kills its worker answers 500 naming the input and saying it may be retried; the
    requests around it are answered; a new worker serves the next ones."""
    from concurrent.futures import ThreadPoolExecutor

    from dependency_injector import providers

    from tests.integration.serving import container_for, serving
    from vllm_srun.adapters.media.samples import data_url

    container = container_for([multimodal_fixture("clip")], media_workers=1, result_cache_entries=0, check_golden=False)
    container.media.override(
        providers.Singleton(MediaService, 1, decoder=FAKE, metrics=container.metrics, workers_source="set")
    )

    def image(data: bytes) -> dict[str, object]:
        return {"type": "image_url", "image_url": {"url": data_url(data, "image/png")}}

    with serving(container) as (client, rt):
        assert next(iter(rt.models.values())).status == "ready"

        def post(items: list[object]) -> httpx.Response:
            return client.post("/v1/embeddings", json={"input": items})

        bodies = [["text", image(f"sleep:0.2;{i}".encode())] for i in range(4)]
        bodies.insert(2, ["text", image(b"exit")])
        with ThreadPoolExecutor(5) as pool:
            answers = list(pool.map(post, bodies))
        died = answers.pop(2)
        assert died.status_code == 500
        error = died.json()["error"]
        assert error["code"] == "internal_error"
        assert error["message"].startswith("input[1]: the media worker decoding it (pid ")
        assert "exited with status 3; it was replaced; retry the request" in error["message"]
        assert all(a.status_code == 200 for a in answers)
        assert post(["again", image(b"fine")]).status_code == 200
        card = client.get("/v1/models").json()["data"][0]["media"]
        assert card["workers_replaced"] == 1 and len(card["worker_pids"]) == 1
        assert metric(client.get("/metrics").text, "vllm_srun_media_workers_replaced_total", reason="exited") == 1


def test_media_workers_start_at_the_nice_asked_and_a_bad_value_is_one_line() -> None:
    """`VLLM_SRUN_MEDIA_NICE`: each worker process lowers its own CPU priority by it (decoding
    yields the cores to the forwards); a value that is not 0..19 is refused before any start."""
    env = {**os.environ, "VLLM_SRUN_MEDIA_NICE": "7"}
    pool = MediaWorkerPool(1, FAKE, env=env)
    pool.start()
    try:
        pid = pool.pids()[0]
        assert pid is not None
        assert os.getpriority(os.PRIO_PROCESS, pid) == os.getpriority(os.PRIO_PROCESS, 0) + 7
    finally:
        pool.stop()
    with pytest.raises(ValueError, match=r"^VLLM_SRUN_MEDIA_NICE must be an integer from 0 to 19, got '20'$"):
        MediaWorkerPool(1, FAKE, env={**os.environ, "VLLM_SRUN_MEDIA_NICE": "20"}).start()
