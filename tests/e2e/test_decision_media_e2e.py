"""Decisions about images and videos end to end (R-API-4, R-MEDIA): the `qwen3_5_vision` fixture
(`vllm-srun fixture --family decision --variant qwen3_5_vision`, golden file included, recorded
through the real surface with an image and a video question) served by a real `vllm-srun serve`
process with a media worker, and through `vllm-sr serve`; the official `typesafe-sdk` client,
unmodified, sends its media assets (a multipart body) and gets the answers a JSON request with the
same image gets."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.front import running_front
from tests.e2e.server import running_server
from vllm_srun.adapters.media.samples import data_url, image_bytes, video_url

typesafe_sdk = pytest.importorskip("typesafe_sdk")
from typesafe_sdk import Choice, Image, Noul, TypeSafeClient  # noqa: E402

pytestmark = pytest.mark.slow
MODEL = "tiny-decision-qwen3_5_vision"
QUESTIONS = {
    "bright": {"type": "noul", "instructions": "Is the picture bright?"},
    "tone": {"type": "choice", "instructions": "Which tone?", "criteria": {"calm": None, "busy": None}},
}
PNG = image_bytes(31, 60, 44)


@pytest.fixture(scope="module")
def package(decision_fixture) -> Path:  # type: ignore[no-untyped-def]
    return Path(decision_fixture("qwen3_5_vision"))


@pytest.fixture(scope="module")
def server(package: Path) -> Iterator[str]:
    with running_server(str(package), "--media-workers", "1", "--result-cache-entries", "0") as base:
        yield base


def test_the_golden_check_passed_with_its_image_and_video_questions(server: str, package: Path) -> None:
    import json

    recorded = json.loads((package / "golden.json").read_text())["requests"]
    assert any("images" in r["body"] for r in recorded) and any("videos" in r["body"] for r in recorded)
    card = httpx.get(f"{server}/v1/models").json()["data"][0]
    assert card["status"] == "ready" and card["golden"]["status"] == "matched", card["golden"]
    assert card["modalities"] == ["image", "text", "video"] and card["media"]["workers"] == 1


def test_the_sdk_sends_an_image_asset_and_gets_the_json_answer(server: str) -> None:
    by_json = httpx.post(
        f"{server}/v1/decisions",
        json={"state": "What is in the picture?", "questions": QUESTIONS, "images": [data_url(PNG, "image/png")]},
        timeout=60,
    )
    assert by_json.status_code == 200, by_json.text
    picture = Image(PNG)
    with TypeSafeClient(api_key="unused", base_url=server, model=MODEL) as client:
        with client.attach_assets(picture):
            result = client.system_one(
                state=f"{picture}What is in the picture?",
                questions={
                    "bright": Noul(instructions="Is the picture bright?"),
                    "tone": Choice(instructions="Which tone?", criteria={"calm": None, "busy": None}),
                },
            )
    want = by_json.json()["answers"]
    assert result.nouls["bright"].noul == pytest.approx(want["bright"]["noul"], abs=1e-12)
    assert result.choices["tone"].probabilities == pytest.approx(want["tone"]["probabilities"], abs=1e-12)
    assert result.usage.input_tokens == by_json.json()["usage"]["input_tokens"]


def test_bad_media_is_400_and_the_sdk_raises_it(server: str) -> None:
    from typesafe_sdk import TypeSafeBadRequestError

    with TypeSafeClient(api_key="unused", base_url=server, model=MODEL) as client:
        with pytest.raises(TypeSafeBadRequestError, match="not an image in a supported format"):
            client.system_one(state=Image(b"%PDF-1.7 not a picture"), questions={"q": Noul(instructions="Is it?")})
    got = httpx.post(
        f"{server}/v1/decisions",
        json={"state": "x", "questions": QUESTIONS, "videos": [data_url(PNG, "video/mp4")]},
        timeout=60,
    )
    assert got.status_code == 400 and got.json()["error"]["message"].startswith("videos[0]: not a video")


def test_through_the_front_a_multipart_body_reaches_the_worker_as_json(package: Path) -> None:
    with running_front(str(package), "--platform", "cpu", "--result-cache-entries", "0") as front:
        video = {"state": "A short clip.", "questions": QUESTIONS, "videos": [video_url(5, 8, 48, 40)]}
        got = httpx.post(f"{front.base}/v1/decisions", json=video, timeout=120)
        assert got.status_code == 200, got.text
        picture = Image(PNG)
        with TypeSafeClient(api_key="unused", base_url=front.base, model=MODEL) as client:
            result = client.system_one(state=picture, questions={"bright": Noul(instructions="Is the picture bright?")})
        direct = httpx.post(
            f"{front.base}/v1/decisions",
            json={"state": "", "questions": {"bright": QUESTIONS["bright"]}, "images": [data_url(PNG, "image/png")]},
            timeout=60,
        )
        assert result.nouls["bright"].noul == pytest.approx(direct.json()["answers"]["bright"]["noul"], abs=1e-12)
