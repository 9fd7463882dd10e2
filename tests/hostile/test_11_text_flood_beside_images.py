"""A client that floods a decision model that reads images with text questions (R-BAT-6): the text
lane is cheaper per token, so while image forwards hold both slots its rows run on the express
forwards and the image forwards pause at their yield points for them (`adapters/lane_yield.py`).
Against a real worker of the tiny `qwen3_5_vision` fixture (two concurrent forwards, profile
`exact`), eight connections ask text questions without a pause while one client asks image
questions one after another: every image question is answered (the flood never starves the image
lane: each pause is bounded, and a slot that frees runs the next plan), with the very answer it
got alone, and every text question is answered 200 with its answer alone."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.test_lane_express_e2e import TEXTS, _image, _text
from tests.hostile.clients import Server, start
from vllm_srun.adapters.media.samples import data_url, image_bytes
from vllm_srun.app.fixtures import write_fixture

IMAGES = [data_url(image_bytes(seed, 320, 240), "image/png") for seed in range(3)]  # larger than the e2e's
IMAGE_ASKS = 6
FLOOD = 8
IMAGE_BOUND_S = 60.0  # one image question under the flood, at most (a starved lane never ends)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    package = write_fixture(tmp_path_factory.mktemp("flood") / "vision", "decision", "qwen3_5_vision", 0, golden=False)
    argv = ["vllm_srun.app.cli", "serve", str(package), "--profile", "exact", "--media-workers", "0"]
    argv += ["--result-cache-entries", "0", "--concurrent-forwards", "2", "--threads", "2", "--log-level", "warning"]
    with start(argv) as running:
        yield running


def test_a_text_flood_never_starves_the_image_questions(server: Server) -> None:
    threads = httpx.get(f"{server.base}/v1/models").json()["data"][0]["threads"]
    assert threads["express_forward"] is True and threads["lane_yield"] is True, threads

    def answers(body: dict) -> dict:
        got = httpx.post(f"{server.base}/v1/decisions", json=body, timeout=120)
        assert got.status_code == 200, got.text
        return got.json()["answers"]

    text_alone = [answers(_text(t)) for t in TEXTS]
    image_alone = [answers(_image(url)) for url in IMAGES]

    async def flood() -> tuple[list[tuple[int, dict, float]], list[tuple[int, dict]]]:
        stop = asyncio.Event()
        limits = httpx.Limits(max_connections=FLOOD + 1, max_keepalive_connections=FLOOD + 1)
        async with httpx.AsyncClient(base_url=server.base, timeout=120, limits=limits) as client:

            async def texts(k: int) -> list[tuple[int, dict]]:
                got = []
                while not stop.is_set():
                    i = (k + len(got)) % len(TEXTS)
                    r = await client.post("/v1/decisions", json=_text(TEXTS[i]))
                    assert r.status_code == 200, r.text
                    got.append((i, r.json()["answers"]))
                return got

            flooders = [asyncio.create_task(texts(k)) for k in range(FLOOD)]
            await asyncio.sleep(0.5)  # the flood runs before the first image question
            images = []
            try:
                for n in range(IMAGE_ASKS):
                    i = n % len(IMAGES)
                    start_s = time.perf_counter()
                    r = await client.post("/v1/decisions", json=_image(IMAGES[i]))
                    assert r.status_code == 200, r.text
                    images.append((i, r.json()["answers"], time.perf_counter() - start_s))
                    assert all(not f.done() for f in flooders), "a flooding client stopped"
            finally:
                stop.set()
            return images, [a for f in flooders for a in await f]

    images, texts = asyncio.run(flood())
    assert len(images) == IMAGE_ASKS
    for i, got, seconds in images:
        assert got == image_alone[i]
        assert seconds < IMAGE_BOUND_S
    assert len(texts) >= FLOOD
    assert all(got == text_alone[i] for i, got in texts)
    assert server.proc.poll() is None, server.log()[-3000:]
