"""Bad images and videos on /v1/decisions never hurt anyone else (R-API-9, R-MEDIA), against a real
`vllm-srun serve` process with its media worker, serving a decision model that reads images and
videos. One concurrent burst mixes every kind of bad medium a hostile client can send (in the
request, in a `states` entry, as a TypeSafe asset, as a multipart body) with good requests. Each
bad request is a 400 `invalid_request` naming the medium and why, and costs no forward; each good
request gets the answer it gets alone; the worker, its media worker and its health are untouched.
All media is made here."""

from __future__ import annotations

import asyncio
import base64
import io
import random
import re
import struct
import zlib
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import httpx
import numpy as np
import pytest

from tests.e2e.server import running_server
from tests.fake_vision import write_fake_vision
from tests.plugin_dist import plugin_env, write_distribution
from tests.prometheus_text import metric
from vllm_srun.adapters.media.samples import data_url, image_bytes, image_url, video_bytes, video_url

pytestmark = pytest.mark.slow
PLUGINS = {
    "vllm_srun.families": {"fake_vision": "tests.fake_vision:FakeVisionFamily"},
    "vllm_srun.engines": {"fake": "tests.fake_family:FakeEnginePlugin"},
}
QUESTIONS = {
    "red": {"type": "noul", "instructions": "is it red"},
    "kind": {"type": "choice", "criteria": {"cat": None, "dog": None}},
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("hostile-vision")
    package = write_fake_vision(root / "fake-vision")
    site = root / "site"
    write_distribution(site, "fake-vision-plugin", "1.0", PLUGINS)
    # bodies up to 64 MiB, so that an image or a video over its own limit reaches the media checks
    args = ("--max-request-bytes", str(64 << 20), "--media-workers", "1", "--result-cache-entries", "0")
    with running_server(str(package), *args, env=plugin_env(site)) as base:
        yield base


def _png_claiming(width: int, height: int) -> bytes:
    """A PNG header declaring WIDTH × HEIGHT pixels, with a few bytes of data (a decompression bomb)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")
    )


def _video(
    fmt: str,
    codec: str = "mpeg4",
    seconds_per_frame: int = 0,
    audio_only: bool = False,
    size: tuple[int, int] = (16, 16),
) -> bytes:
    """A small video in container FMT (frames of SIZE, width × height); SECONDS_PER_FRAME > 0: four
    frames that long each; AUDIO_ONLY: a file with a sound stream and no video stream."""
    import av
    from av.audio.stream import AudioStream
    from av.video.stream import VideoStream

    buf = io.BytesIO()
    with av.open(buf, mode="w", format=fmt) as out:
        if audio_only:
            sound = out.add_stream("aac", rate=8000)
            assert isinstance(sound, AudioStream)
            frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
            frame.sample_rate = 8000
            for packet in [*sound.encode(frame), *sound.encode()]:
                out.mux(packet)
        else:
            rate = Fraction(1, seconds_per_frame) if seconds_per_frame else Fraction(8, 1)
            stream = out.add_stream(codec, rate=rate)
            assert isinstance(stream, VideoStream)
            stream.width, stream.height = size
            stream.pix_fmt = "yuv420p"
            for i in range(4 if seconds_per_frame else 2 if size[0] > 16 else 8):
                image = av.VideoFrame.from_ndarray(np.full((size[1], size[0], 3), 30 * i, np.uint8), format="rgb24")
                for packet in stream.encode(image):
                    out.mux(packet)
            for packet in stream.encode():
                out.mux(packet)
    return buf.getvalue()


PNG = image_bytes(1, 64, 48)
MP4 = video_bytes(2, 8)


def _asset(data: bytes) -> dict[str, Any]:
    return {"type": "image", "data_base64": base64.b64encode(data).decode()}


# (what the bad request adds to a good one, the reason its error names)
BAD: list[tuple[dict[str, Any], str]] = [
    ({"images": ["https://example.com/cat.png"]}, r"^images\[0\]: only data: URLs are read"),
    ({"images": ["file:///etc/passwd"]}, r"^images\[0\]: only data: URLs are read"),
    ({"images": ["data:image/png;base64,not*base64!"]}, r"^images\[0\]: invalid base64"),
    ({"images": [data_url(PNG, "video/mp4")]}, r"^images\[0\]: a data URL of type video/mp4 where an image"),
    ({"images": [image_url(3), data_url(PNG[: len(PNG) // 2], "image/png")]}, r"^images\[1\]: corrupt or truncated"),
    ({"images": [data_url(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4, "image/png")]}, r"^images\[0\]: corrupt PNG"),
    (
        {"images": [data_url(b"%PDF-1.7\n" + b"x" * 100, "image/png")]},
        r"^images\[0\]: not an image in a supported format",
    ),
    (
        {"images": [data_url(b'<svg xmlns="http://www.w3.org/2000/svg"/>', "image/svg+xml")]},
        r"not an image in a supported",
    ),
    (
        {"images": [data_url(image_bytes(4, fmt="GIF"), "image/gif")]},
        r"^images\[0\]: a GIF image, and this model reads PNG",
    ),
    ({"images": [data_url(image_bytes(4, fmt="BMP"), "image/bmp")]}, r"^images\[0\]: a BMP image"),
    (
        {"images": [data_url(_png_claiming(100_000, 100_000), "image/png")]},
        r"10000000000 pixels, over the limit of 16000000",
    ),
    (
        {"images": [data_url(_png_claiming(5000, 4000), "image/png")]},
        r"^images\[0\]: the image is 5000×4000 = 20000000 pixels",
    ),
    (
        {"images": [data_url(image_bytes(4, 1, 300), "image/png")]},
        r"^images\[0\]: the image cannot be preprocessed: an aspect ratio over 200:1",
    ),
    (
        {"images": [data_url(b"\xff\xd8\xff" + b"\0" * 8_000_000, "image/jpeg")]},
        r"^images\[0\]: the image is over the limit of 8000000 bytes",
    ),
    (
        {"videos": [data_url(_video("mp4", audio_only=True), "video/mp4")]},
        r"^videos\[0\]: the file has no video stream",
    ),
    ({"videos": [data_url(MP4[: len(MP4) // 2], "video/mp4")]}, r"^videos\[0\]: unreadable mov container"),
    ({"videos": [data_url(PNG, "video/mp4")]}, r"^videos\[0\]: not a video in a supported container"),
    (
        {"videos": [data_url(_video("avi"), "video/x-msvideo")]},
        r"^videos\[0\]: a AVI video, and this model reads MP4/MOV, Matroska/WebM only",
    ),
    (
        {"videos": [data_url(_video("mp4", seconds_per_frame=100), "video/mp4")]},
        r"^videos\[0\]: the video lasts 400.0 s, over the limit of 300 s",
    ),
    (
        {"videos": [data_url(_video("mp4", size=(4000, 2176)), "video/mp4")]},
        r"^videos\[0\]: video frames are 4000×2176 = 8704000 pixels, over the limit of 8294400",
    ),
    (
        {"videos": [data_url(b"\0\0\0\x20ftypisom" + b"\0" * 32_000_000, "video/mp4")]},
        r"^videos\[0\]: the video is over the limit of 32000000 bytes",
    ),
    (
        {"states": {"s": {"state": "a dog", "questions": QUESTIONS, "images": [data_url(b"bad", "image/png")]}}},
        r"^states\.'s'\.images\[0\]: not an image",
    ),
    (
        {"states": {"s": {"state": "a dog", "questions": QUESTIONS, "videos": ["data:video/mp4;base64,@@"]}}},
        r"^states\.'s'\.videos\[0\]: invalid base64",
    ),
    (
        {"state": "<p> a cat", "assets": {"<p>": _asset(b"GIF89a" + b"\0" * 32)}},
        r"^assets\.'<p>': (a GIF image|corrupt GIF)",
    ),
    (
        {"state": "<p> a cat", "assets": {"<p>": {"type": "image", "part": "asset-0"}}},
        r"^assets\.'<p>': part 'asset-0' names a part of a multipart",
    ),
    (
        {"images": [image_url(5)] * 600},
        r"600 images and 0 videos take at least 600 input tokens, over the model's limit of 512",
    ),
]
GOOD: list[dict[str, Any]] = [
    {"state": "the cat", "questions": QUESTIONS, "images": [image_url(6, 50, 40)]},
    {"state": "the dog", "questions": QUESTIONS, "videos": [video_url(7, 6, 32, 24)]},
    {"state": "a red bird", "questions": QUESTIONS},
    {"state": "<p> the cat", "questions": QUESTIONS, "assets": {"<p>": _asset(image_bytes(8, 30, 30, fmt="JPEG"))}},
    {
        "state": "x",
        "questions": QUESTIONS,
        "states": {"y": {"state": "y", "questions": QUESTIONS, "images": [image_url(9)]}},
    },
]


def _rows(body: dict[str, Any]) -> dict[str, int]:
    """Rows a good request runs under the exact profile: one a question, in the media lane when its state has media."""
    entries = [body, *body.get("states", {}).values()]
    out = {"text": 0, "media": 0}
    for entry in entries:
        lane = "media" if entry.get("images") or entry.get("videos") or entry.get("assets") else "text"
        out[lane] += len(entry["questions"])
    return out


def test_a_burst_of_bad_media_hurts_no_one(server: str) -> None:
    alone = [httpx.post(f"{server}/v1/decisions", json=g, timeout=60).json() for g in GOOD]
    assert all("answers" in a for a in alone), alone
    scrape = httpx.get(f"{server}/metrics").text
    rows_before = {lane: metric(scrape, "vllm_srun_rows_total", lane=lane) for lane in ("text", "media")}
    media_before = httpx.get(f"{server}/v1/models").json()["data"][0]["media"]

    # every bad request once, every good one three times, shuffled into one concurrent burst
    plan = [("bad", i) for i in range(len(BAD))] + [("good", j % len(GOOD)) for j in range(3 * len(GOOD))]
    random.Random(0).shuffle(plan)
    base = {"state": "the cat", "questions": QUESTIONS}
    bodies = [{**base, **BAD[i][0]} if kind == "bad" else GOOD[i] for kind, i in plan]

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server, timeout=120) as client:
            return await asyncio.gather(*(client.post("/v1/decisions", json=b) for b in bodies))

    for (kind, i), response in zip(plan, asyncio.run(burst())):
        if kind == "good":
            assert response.status_code == 200, response.text
            assert response.json() == alone[i]
            continue
        reason = BAD[i][1]
        assert response.status_code == 400, (reason, response.text[:300])
        error = response.json()["error"]
        assert error["code"] == "invalid_request" and re.search(reason, error["message"]), (reason, error)
        assert "\n" not in error["message"] and len(error["message"]) < 600

    scrape = httpx.get(f"{server}/metrics").text
    ran = {lane: metric(scrape, "vllm_srun_rows_total", lane=lane) - rows_before[lane] for lane in ("text", "media")}
    sent = [GOOD[i] for kind, i in plan if kind == "good"]
    assert ran == {lane: sum(_rows(g)[lane] for g in sent) for lane in ("text", "media")}  # a bad request: no row
    media_after = httpx.get(f"{server}/v1/models").json()["data"][0]["media"]
    assert media_after["worker_pids"] == media_before["worker_pids"] and media_after["workers_replaced"] == 0
    assert httpx.get(f"{server}/health").status_code == 200
    again = [httpx.post(f"{server}/v1/decisions", json=g, timeout=60).json() for g in GOOD]
    assert again == alone


def test_a_multipart_body_that_lies_is_400_and_the_server_stays(server: str) -> None:
    boundary = "XyZ"
    request = b'{"state": "<i> a cat", "questions": {"red": {"type": "noul", "instructions": "red"}}, "assets": {"<i>": {"type": "image", "part": "asset-0"}}}'

    def body(*parts: tuple[str, bytes]) -> bytes:
        head = '--{b}\r\nContent-Disposition: form-data; name="{n}"\r\n\r\n'
        chunks = [head.format(b=boundary, n=name).encode() + content + b"\r\n" for name, content in parts]
        return b"".join(chunks) + f"--{boundary}--\r\n".encode()

    headers = {"content-type": f"multipart/form-data; boundary={boundary}"}
    cases = [
        (body(("request", request), ("asset-0", _png_claiming(100_000, 100_000))), "over the limit of 16000000"),
        (body(("request", request)), "which the body does not hold"),
        (body(("request", request), ("asset-0", PNG), ("asset-0", PNG)), "two parts named"),
        (body(("request", b"{"), ("asset-0", PNG)), "not valid JSON"),
    ]
    for content, reason in cases:
        got = httpx.post(f"{server}/v1/systemone", content=content, headers=headers, timeout=60)
        assert got.status_code == 400 and reason in got.json()["error"]["message"], (reason, got.text[:300])
    good = httpx.post(f"{server}/v1/systemone", content=body(("request", request), ("asset-0", PNG)), headers=headers)
    assert good.status_code == 200, good.text
    assert httpx.get(f"{server}/health").status_code == 200


def test_a_body_over_the_limit_is_413_and_the_server_stays(server: str) -> None:
    big = {"state": "x", "questions": QUESTIONS, "images": ["data:image/png;base64," + "A" * (65 << 20)]}
    response = httpx.post(f"{server}/v1/decisions", json=big, timeout=120)
    assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"
    assert httpx.get(f"{server}/health").status_code == 200
