"""Images and videos on /v1/decisions (R-API-4, R-BAT-6, R-MEDIA, R-PERF-4, R-SC), in process,
served by the fake vision family (`tests/fake_vision.py`: our real prompt side, Qwen3.5's real
preprocessing in the media decoder, a hashed forward): requests, states entries and TypeSafe
assets; the `media` lane; decode once; the state (its media included) read once under a sharing
profile and carried by every row under `exact`; every bad medium a 400 that costs no forward."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fake_family import FakeEnginePlugin
from tests.fake_vision import FakeVisionFamily, FakeVisionModel, write_fake_vision
from tests.fakes import FakeDevice
from tests.integration.serving import container_for, serving
from vllm_srun.adapters.engines.registry import EngineRegistry
from vllm_srun.adapters.families.registry import FamilyRegistry
from vllm_srun.adapters.media.samples import data_url, image_bytes, image_url, video_url
from vllm_srun.adapters.plugins import ENGINES_GROUP, FAMILIES_GROUP, PluginInfo
from vllm_srun.domain.settings.engine_args import EngineArgs

NOUL = {"type": "noul", "instructions": "is it red"}
QUESTIONS = {
    "red": NOUL,
    "kind": {"type": "choice", "criteria": {"cat": None, "dog": None}},
    "stars": {"type": "score", "criteria": ["bad", "good", "great"]},
}


def registries() -> tuple[FamilyRegistry, EngineRegistry]:
    family = PluginInfo(FAMILIES_GROUP, "fake_vision", "fake-srun-plugin", "1.0")
    engine = PluginInfo(ENGINES_GROUP, "fake", "fake-srun-plugin", "1.0")
    return (
        FamilyRegistry(families={"fake_vision": (family, FakeVisionFamily())}),
        EngineRegistry(engines={"fake": (engine, FakeEnginePlugin())}),
    )


def vision_container(package: Path, args: EngineArgs | None = None, **settings: Any) -> Any:
    """A worker serving PACKAGE (under ARGS: by default the shared_context profile, no batch window)."""
    families, engines = registries()
    adapters = {"families": families, "engines": engines, "device": FakeDevice()}
    args = args or EngineArgs(batch_window_ms=0, profile="shared_context")
    return container_for([(package, args)], adapters=adapters, **settings)


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_fake_vision(tmp_path_factory.mktemp("vision") / "fake-vision")


@pytest.fixture(scope="module")
def served(package: Path) -> Iterator[tuple[Any, FakeVisionModel, Any]]:
    with serving(vision_container(package, media_workers=0, max_request_bytes=64 << 20)) as (client, rt):
        model = next(iter(rt.models.values())).model
        assert isinstance(model, FakeVisionModel)
        yield client, model, rt


def _post(client: Any, body: dict[str, Any]) -> Any:
    return client.post("/v1/decisions", json=body)


def test_card_lists_the_modalities_and_the_image_limits(served: tuple[Any, FakeVisionModel, Any]) -> None:
    client, _, _ = served
    card = client.get("/v1/models").json()["data"][0]
    assert card["modalities"] == ["image", "text", "video"]
    limits = card["limits"]
    assert limits["image_max_bytes"] == 8_000_000 and limits["image_source_max_pixels"] == 16_000_000
    assert limits["image_max_pixels"] == 32 * 32  # the package's processor
    assert limits["video_max_seconds"] == 300 and limits["video_max_tokens"] == 16_384
    assert card["media"]["lane"] == "media" and "decode_cache" in card["media"]


def test_an_image_is_read_in_front_of_the_state_in_the_media_lane(served: tuple[Any, FakeVisionModel, Any]) -> None:
    client, model, _ = served
    plain = _post(client, {"state": "the cat", "questions": QUESTIONS})
    before = len(model.forwards)
    seen = _post(client, {"state": "the cat", "questions": QUESTIONS, "images": [image_url(1, 40, 30)]})
    assert plain.status_code == 200 and seen.status_code == 200, seen.text
    assert seen.json()["answers"] != plain.json()["answers"]  # the image changed what the model read
    lanes = {lane for lane, _ in model.forwards[before:]}
    assert lanes == {"media"}, model.forwards[before:]
    # the image's tokens count once with the state: 40 × 30 is resized to 32 × 24 (at most 32 × 32 pixels,
    # sides multiples of 8), one token per 8 × 8 pixels: 12, and the tokens that open and close it
    assert seen.json()["usage"]["input_tokens"] == plain.json()["usage"]["input_tokens"] + 12 + 2
    other = _post(client, {"state": "the cat", "questions": QUESTIONS, "images": [image_url(2, 40, 30)]})
    assert other.json()["answers"] != seen.json()["answers"]
    two = _post(
        client, {"state": "the cat", "questions": QUESTIONS, "images": [image_url(2, 40, 30), image_url(1, 40, 30)]}
    )
    swapped = _post(
        client, {"state": "the cat", "questions": QUESTIONS, "images": [image_url(1, 40, 30), image_url(2, 40, 30)]}
    )
    assert two.json()["answers"] != swapped.json()["answers"]  # in request order


def test_states_entries_carry_their_own_images(served: tuple[Any, FakeVisionModel, Any]) -> None:
    client, _, _ = served
    image = image_url(3, 24, 24)
    body = {
        "state": "a dog",
        "questions": {"red": NOUL},
        "states": {"x": {"state": "the cat", "questions": QUESTIONS, "images": [image]}},
    }
    got = _post(client, body)
    assert got.status_code == 200, got.text
    alone = _post(client, {"state": "the cat", "questions": QUESTIONS, "images": [image]})
    assert got.json()["states"]["x"]["answers"] == alone.json()["answers"]
    assert got.json()["states"]["x"]["usage"] == alone.json()["usage"]
    own = _post(client, {"state": "a dog", "questions": {"red": NOUL}})
    assert got.json()["answers"] == own.json()["answers"]


def test_shared_and_exact_answer_alike_and_the_state_is_decoded_once(
    served: tuple[Any, FakeVisionModel, Any],
) -> None:
    client, model, rt = served
    image = image_url(4, 64, 48)
    body = {"state": "the red cat", "questions": QUESTIONS, "images": [image]}
    loader = rt.media
    misses = loader.misses
    before = len(model.forwards)
    shared = _post(client, body)
    assert model.forwards[before:] == [("media", 1)]  # one shared row: the state and its image once
    exact = _post(client, {**body, "options": {"profile": "exact"}})
    assert sum(n for _, n in model.forwards[before + 1 :]) == len(QUESTIONS)  # one row a question
    assert all(lane == "media" for lane, _ in model.forwards[before + 1 :])
    assert loader.misses == misses + 1  # decoded for the first request only
    assert shared.json()["answers"] == exact.json()["answers"]
    assert shared.json()["usage"] == exact.json()["usage"]


def test_assets_as_typesafe_sends_them(served: tuple[Any, FakeVisionModel, Any]) -> None:
    client, _, _ = served
    png = image_bytes(5, 32, 32)
    url = data_url(png, "image/png")
    by_url = _post(client, {"state": "the cat", "questions": QUESTIONS, "images": [url]})
    placeholder = "<image:0123abcd>"
    asset = {"type": "image", "format": "png", "data_base64": base64.b64encode(png).decode()}
    by_asset = _post(client, {"state": f"{placeholder}the cat", "questions": QUESTIONS, "assets": {placeholder: asset}})
    assert by_asset.status_code == 200, by_asset.text
    assert by_asset.json()["answers"] == by_url.json()["answers"]  # in front of the text, the placeholder gone
    asked = _post(
        client,
        {
            "state": f"the cat {placeholder}",
            "questions": {"red": NOUL, "which": {"type": "noul", "instructions": f"is {placeholder} a cat"}},
            "assets": {placeholder: asset},
        },
    )
    assert asked.status_code == 200 and asked.json()["answers"]["which"]["error"] == "invalid_question"
    assert "the question names the asset" in asked.json()["answers"]["which"]["message"]
    assert "noul" in asked.json()["answers"]["red"]
    unused = _post(client, {"state": "the cat", "questions": QUESTIONS, "assets": {placeholder: asset}})
    assert unused.status_code == 400 and "appears nowhere in the state" in unused.json()["error"]["message"]


def test_a_reserved_token_in_a_text_fails_its_questions(served: tuple[Any, FakeVisionModel, Any]) -> None:
    client, _, _ = served
    got = _post(client, {"state": "the <|image_pad|> cat", "questions": {"red": NOUL, "kind": QUESTIONS["kind"]}})
    assert got.status_code == 400 and "keep for images" in got.json()["error"]["message"]
    mixed = _post(
        client,
        {
            "state": "the cat",
            "questions": {"red": NOUL, "odd": {"type": "noul", "instructions": "<|vision_start|> red"}},
        },
    )
    assert mixed.status_code == 200 and mixed.json()["answers"]["odd"]["error"] == "invalid_question"
    assert "noul" in mixed.json()["answers"]["red"]


BAD: list[tuple[dict[str, Any], str]] = [
    ({"images": ["https://example.com/cat.png"]}, r"^images\[0\]: only data: URLs are read"),
    ({"images": ["data:image/png;base64,not*base64!"]}, r"^images\[0\]: invalid base64"),
    (
        {"images": [data_url(image_bytes(1, 32, 32, fmt="GIF"), "image/gif")]},
        r"^images\[0\]: a GIF image, and this model reads PNG, JPEG, WEBP only",
    ),
    ({"images": [data_url(image_bytes(1)[:60], "image/png")]}, r"^images\[0\]: corrupt or truncated"),
    (
        {"images": [image_url(1), data_url(b"%PDF-1.7", "image/png")]},
        r"^images\[1\]: not an image in a supported format",
    ),
    ({"videos": [data_url(image_bytes(1), "video/mp4")]}, r"^videos\[0\]: not a video in a supported container"),
    (
        {"images": ["data:image/png;base64," + "A" * 10_700_000]},
        r"^images\[0\]: the image is over the limit of 8000000 bytes",
    ),
    ({"images": [image_url(1)] * 600}, r"^images and videos: 600 images and 0 videos take at least 600 input tokens"),
]


@pytest.mark.parametrize("extra, reason", BAD, ids=[r for _, r in BAD])
def test_bad_media_is_400_naming_it_and_runs_nothing(
    served: tuple[Any, FakeVisionModel, Any], extra: dict[str, Any], reason: str
) -> None:
    import re

    client, model, _ = served
    before = len(model.forwards)
    got = _post(client, {"state": "the cat", "questions": QUESTIONS, **extra})
    assert got.status_code == 400, got.text
    error = got.json()["error"]
    assert error["code"] == "invalid_request" and re.search(reason, error["message"]), error["message"]
    assert len(model.forwards) == before


def long_video(seconds_per_frame: int = 100, frames: int = 4) -> bytes:
    """An MP4 whose header says FRAMES × SECONDS_PER_FRAME seconds (a few tiny frames)."""
    import io
    from fractions import Fraction

    import av
    import numpy as np
    from av.video.stream import VideoStream

    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as out:
        stream = out.add_stream("mpeg4", rate=Fraction(1, seconds_per_frame))
        assert isinstance(stream, VideoStream)
        stream.width = stream.height = 16
        stream.pix_fmt = "yuv420p"
        for i in range(frames):
            frame = av.VideoFrame.from_ndarray(np.full((16, 16, 3), 40 * i, np.uint8), format="rgb24")
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


def test_a_video_is_sampled_read_and_decoded_once(served: tuple[Any, FakeVisionModel, Any]) -> None:
    client, model, rt = served
    video = video_url(6, frames=12, width=32, height=24)  # 1.5 s at 8 frames a second
    body = {"state": "the cat", "questions": QUESTIONS, "videos": [video]}
    misses, hits = rt.media.misses, rt.media.hits
    before = len(model.forwards)
    first = _post(client, body)
    assert first.status_code == 200, first.text
    assert {lane for lane, _ in model.forwards[before:]} == {"media"}
    plain = _post(client, {"state": "the cat", "questions": QUESTIONS})
    # 1.5 s at 2 frames a second: 3, at least 4 frames, in groups of 2 → 2 groups; 4 frames of 32 × 24 within
    # the budget (8 × 16 × 16 pixels for all) → 24 × 16 each → one token per 8 × 8 pixels: 6 tokens a group
    tokens = first.json()["usage"]["input_tokens"] - plain.json()["usage"]["input_tokens"]
    pads = 2 * 6
    assert tokens > pads + 2 * 2  # the pads, the start and end of each group, and its `<t seconds>` text
    assert model.media_tokens("video", (4, 3, 16, 24)) == pads
    again = _post(client, body)
    assert again.json() == first.json()
    assert rt.media.misses == misses + 1 and rt.media.hits == hits + 1  # the second request decoded nothing
    both = _post(client, {**body, "images": [image_url(1, 40, 30)]})
    assert both.status_code == 200 and both.json()["answers"] != first.json()["answers"]


def test_too_long_a_video_is_400(served: tuple[Any, FakeVisionModel, Any]) -> None:
    client, model, _ = served
    before = len(model.forwards)
    got = _post(client, {"state": "x", "questions": QUESTIONS, "videos": [data_url(long_video(), "video/mp4")]})
    assert got.status_code == 400, got.text
    assert got.json()["error"]["message"].startswith("videos[0]: the video lasts 400.0 s, over the limit of 300 s")
    assert len(model.forwards) == before


def test_the_videos_of_a_request_share_a_token_budget(tmp_path: Path) -> None:
    package = write_fake_vision(tmp_path / "fake-vision", max_video_tokens=20)  # a video below: 12 tokens
    with serving(vision_container(package, media_workers=0)) as (client, _):
        one = video_url(6, frames=12, width=32, height=24)
        ok = _post(client, {"state": "x", "questions": QUESTIONS, "videos": [one]})
        assert ok.status_code == 200, ok.text
        two = _post(client, {"state": "x", "questions": QUESTIONS, "videos": [one, video_url(7, 12, 32, 24)]})
        assert two.status_code == 400
        assert two.json()["error"]["message"].startswith(
            "videos: the request's videos take 24 input tokens, over the 20"
        )


def typesafe_body(state: Any, questions: dict[str, Any], **kwargs: Any) -> tuple[bytes, dict[str, str]]:
    """The body and headers the `typesafe-sdk` client (0.7.5) sends for `system_one(state, questions)`
    with media assets: a multipart/form-data body built by its own request code."""
    import httpx2
    from typesafe_sdk._core.assets import resolve_assets
    from typesafe_sdk._core.config import Config
    from typesafe_sdk._core.endpoints import prepare_system_one, with_assets
    from typesafe_sdk._core.response_types import SystemOneResponse

    config = Config("key", "http://worker", "fake-vision", 30.0, httpx2.Headers(), None)
    request, pending = prepare_system_one(config, state, questions, None, None, None, None, SystemOneResponse, **kwargs)
    assert pending is not None, "the client sends no assets for this request"
    request = with_assets(request, resolve_assets(pending))
    assert request.content is not None
    return request.content, {"content-type": request.headers["content-type"]}


def test_the_typesafe_client_sends_images_as_multipart(served: tuple[Any, FakeVisionModel, Any]) -> None:
    from typesafe_sdk import Image

    client, _, _ = served
    png = image_bytes(8, 40, 24)
    by_url = _post(client, {"state": "the cat", "questions": QUESTIONS, "images": [data_url(png, "image/png")]})
    picture = Image(png)
    # the image inside the text (`client.attach_assets(picture)` makes it known to the client)
    content, headers = typesafe_body(f"{picture}the cat", QUESTIONS, attached={str(picture): picture})
    assert headers["content-type"].startswith("multipart/form-data")
    got = client.post("/v1/systemone", content=content, headers=headers)
    assert got.status_code == 200, got.text
    assert got.json()["answers"] == by_url.json()["answers"]
    alone = Image(png)
    content, headers = typesafe_body(alone, QUESTIONS)  # the image is the whole state
    only = client.post("/v1/systemone", content=content, headers=headers)
    assert only.status_code == 200, only.text
    plain = _post(client, {"state": "", "questions": QUESTIONS, "images": [data_url(png, "image/png")]})
    assert only.json()["answers"] == plain.json()["answers"]
    named = typesafe_body("the cat {x}", QUESTIONS, assets={"{x}": Image(png)})  # an alias the caller chose
    aliased = client.post("/v1/systemone", content=named[0], headers=named[1])
    same = _post(client, {"state": "the cat ", "questions": QUESTIONS, "images": [data_url(png, "image/png")]})
    assert aliased.status_code == 200 and aliased.json()["answers"] == same.json()["answers"]


def test_multipart_bodies_that_do_not_add_up_are_400(served: tuple[Any, FakeVisionModel, Any]) -> None:
    client, model, _ = served
    before = len(model.forwards)
    boundary = "b0undary"
    request = b'{"state": "<i>the cat", "questions": {"red": {"type": "noul", "instructions": "red"}}, "assets": {"<i>": {"type": "image", "part": "asset-0"}}}'

    def body(*parts: tuple[str, bytes]) -> bytes:
        chunks = [
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\nContent-Type: application/octet-stream\r\n\r\n'.encode()
            + content
            + b"\r\n"
            for name, content in parts
        ]
        return b"".join(chunks) + f"--{boundary}--\r\n".encode()

    headers = {"content-type": f"multipart/form-data; boundary={boundary}"}
    cases = [
        (body(("request", request)), "names part 'asset-0', which the body does not hold"),
        (
            body(("request", request), ("asset-0", image_bytes(1)), ("asset-1", b"x")),
            "part 'asset-1' of the multipart body is named by no asset",
        ),
        (body(("asset-0", image_bytes(1))), "no part named 'request'"),
        (body(("request", b"[1]"), ("asset-0", b"x")), "must hold a JSON object"),
        (body(("request", request), ("asset-0", b"not an image")), r"assets.'<i>': not an image in a supported format"),
        (body(("request", request), ("asset-0", image_bytes(1)))[:-8], "closing boundary"),
    ]
    for content, reason in cases:
        got = client.post("/v1/systemone", content=content, headers=headers)
        assert got.status_code == 400, (reason, got.text)
        assert reason in got.json()["error"]["message"], (reason, got.json())
    good = client.post(
        "/v1/systemone", content=body(("request", request), ("asset-0", image_bytes(1))), headers=headers
    )
    assert good.status_code == 200, good.text
    assert len(model.forwards) == before + 1
    no_boundary = client.post("/v1/systemone", content=b"x", headers={"content-type": "multipart/form-data"})
    assert no_boundary.status_code == 400 and "boundary" in no_boundary.json()["error"]["message"]
