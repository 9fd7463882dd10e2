"""R-BAT-6's lane express end to end: a real `vllm-srun serve` of the tiny `qwen3_5_vision`
decision fixture (two concurrent forwards and the express forward, `VLLM_SRUN_EXPRESS_FORWARD`
on), profile `exact`. Text questions asked while image questions keep both forward slots busy
(their text rows ride the express forward beside the image forwards: three forwards of one model
at once) get the very answers they get alone, and so do the image questions; none fails."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.server import running_server
from vllm_srun.adapters.media.samples import data_url, image_bytes
from vllm_srun.app.fixtures import write_fixture

pytestmark = pytest.mark.slow
QUESTIONS = {
    "bright": {"type": "noul", "instructions": "Is it bright?"},
    "tone": {"type": "choice", "instructions": "Which tone?", "criteria": {"calm": None, "busy": None}},
}
TEXTS = [f"I was charged twice for order {i} and nobody answers." for i in range(4)]
IMAGES = [data_url(image_bytes(seed, 96, 72), "image/png") for seed in range(3)]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    package = write_fixture(
        tmp_path_factory.mktemp("express") / "vision", "decision", "qwen3_5_vision", 0, golden=False
    )
    flags = (str(package), "--profile", "exact", "--media-workers", "0", "--result-cache-entries", "0")
    flags += ("--concurrent-forwards", "2", "--threads", "2")
    with running_server(*flags, env={"VLLM_SRUN_EXPRESS_FORWARD": "1"}) as base:
        yield base


def _text(text: str) -> dict:
    return {"state": text, "questions": QUESTIONS}


def _image(url: str) -> dict:
    return {"state": "What does the picture show?", "questions": QUESTIONS, "images": [url]}


def test_text_and_image_answers_under_the_express_equal_their_answers_alone(server: str) -> None:
    card = httpx.get(f"{server}/v1/models").json()["data"][0]
    assert card["threads"]["express_forward"] is True and card["threads"]["concurrent_forwards"] == 2
    assert card["threads"]["lane_yield"] is True  # the image forwards pause for the text ones (R-BAT-6)

    def answers(body: dict) -> dict:
        got = httpx.post(f"{server}/v1/decisions", json=body, timeout=120)
        assert got.status_code == 200, got.text
        return got.json()["answers"]

    text_alone = [answers(_text(t)) for t in TEXTS]
    image_alone = [answers(_image(url)) for url in IMAGES]

    async def under_load() -> tuple[list[dict], list[bool]]:
        stop = asyncio.Event()
        async with httpx.AsyncClient(base_url=server, timeout=120) as client:

            async def images(k: int) -> list[tuple[int, dict]]:
                got = []
                while not stop.is_set():
                    i = (k + len(got)) % len(IMAGES)
                    r = await client.post("/v1/decisions", json=_image(IMAGES[i]))
                    assert r.status_code == 200, r.text
                    got.append((i, r.json()["answers"]))
                return got

            loaders = [asyncio.create_task(images(k)) for k in range(4)]
            await asyncio.sleep(0.5)  # the image load holds the slots before text is asked
            texts = []
            for _ in range(3):
                for t in TEXTS:
                    r = await client.post("/v1/decisions", json=_text(t))
                    assert r.status_code == 200, r.text
                    texts.append(r.json()["answers"])
            stop.set()
            done = [pair for batch in await asyncio.gather(*loaders) for pair in batch]
        return texts, [image_alone[i] == got for i, got in done]

    texts, images_equal = asyncio.run(under_load())
    assert texts == text_alone * 3
    assert images_equal and all(images_equal)
