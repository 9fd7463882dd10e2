"""Bad media never hurts anyone else (R-API-9, R-MEDIA), against a real `vllm-srun serve` process
with its media worker: one concurrent burst mixes every kind of bad input a hostile client can
send with good requests. Each bad item fails in its own slot (`invalid_input`, naming its input
and why) and costs no forward, while its request's good items are answered as they are alone (the
upstream contract's per-item errors); each good request gets the answer it gets alone; the worker,
its media worker and its health are untouched. All media is made here."""

from __future__ import annotations

import asyncio
import base64
import io
import random
import re
import struct
import subprocess
import sys
import zlib
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import httpx
import numpy as np
import pytest

from tests.e2e.server import running_server
from tests.prometheus_text import metric
from vllm_srun.adapters.media.samples import data_url, image_bytes, image_url, video_bytes, video_url
from vllm_srun.domain.inputs.media import IMAGE_MAX_BYTES

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    out = tmp_path_factory.mktemp("hostile") / "tiny-siglip"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "vllm_srun.app.cli",
            "fixture",
            str(out),
            "--family",
            "multimodal",
            "--variant",
            "siglip",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    # bodies up to 64 MiB, so that an image over its own 16 MiB limit reaches the media checks
    args = ("--max-request-bytes", str(64 << 20), "--media-workers", "1", "--result-cache-entries", "0")
    with running_server(str(out), *args) as base:
        yield base


def _png_claiming(width: int, height: int) -> bytes:
    """A decompression bomb's header: WIDTH × HEIGHT pixels declared, a few bytes of data."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")
    )


def _container(streams: str) -> bytes:
    """A Matroska file with an audio stream and (when STREAMS is `both`) a video stream without frames."""
    import av
    from av.audio.stream import AudioStream
    from av.video.stream import VideoStream

    buf = io.BytesIO()
    with av.open(buf, mode="w", format="matroska" if streams == "both" else "mp4") as out:
        if streams == "both":
            video = out.add_stream("mpeg4", rate=Fraction(10, 1))
            assert isinstance(video, VideoStream)
            video.width = video.height = 16
        sound = out.add_stream("aac", rate=8000)
        assert isinstance(sound, AudioStream)
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
        frame.sample_rate = 8000
        for packet in [*sound.encode(frame), *sound.encode()]:
            out.mux(packet)
    return buf.getvalue()


def _image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def _video(url: str) -> dict[str, Any]:
    return {"type": "video_url", "video_url": {"url": url}}


PNG = image_bytes(1, 64, 48)
MP4 = video_bytes(2, 8)
# (the bad item, the reason its error names); each is sent after a good text and a good image
BAD: list[tuple[dict[str, Any], str]] = [
    (_image("data:image/png;base64,not*base64!"), "invalid base64"),
    (_image("https://example.com/cat.png"), "only data: URLs are read"),
    (_image("file:///etc/passwd"), "only data: URLs are read"),
    (_image(data_url(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4, "image/png")), "corrupt PNG image"),
    (_image(data_url(PNG[: len(PNG) // 2], "image/png")), "corrupt or truncated"),
    (_image(data_url(b"%PDF-1.7\n" + b"x" * 100, "image/png")), "not an image in a supported format"),
    (
        _image(data_url(b'<svg xmlns="http://www.w3.org/2000/svg"/>', "image/svg+xml")),
        "not an image in a supported format",
    ),
    (
        _image(data_url(_png_claiming(100_000, 100_000), "image/png")),
        r"10000000000 pixels, over the limit .* before decoding",
    ),
    (_image(data_url(b"\xff\xd8\xff" + b"\0" * IMAGE_MAX_BYTES, "image/jpeg")), "over the limit of 16777216 bytes"),
    (_video(data_url(_container("audio"), "video/mp4")), "no video stream"),
    (_video(data_url(_container("both"), "video/x-matroska")), "no frames"),
    (_video(data_url(MP4[: len(MP4) // 2], "video/mp4")), "unreadable mov container"),
    (_video(data_url(PNG, "video/mp4")), "not a video in a supported container"),
    (_video(data_url(b"RIFF\0\0\0\0WAVEfmt " + b"\0" * 64, "video/mp4")), "not a video in a supported container"),
]
GOOD: list[list[Any]] = [
    ["a photo of a red square", _image(image_url(3, 50, 40))],
    [_video(video_url(4, 6)), "blue sky"],
    [_image(image_url(5, 30, 70, fmt="JPEG")), _image(image_url(6, 90, 20, fmt="WEBP"))],
    ["the sea at night"],
]


def _rows(items: list[Any], frames: int = 4) -> dict[str, int]:
    media = sum(1 if i["type"] == "image_url" else frames for i in items if isinstance(i, dict))
    return {"text": len(items) - sum(isinstance(i, dict) for i in items), "media": media}


def test_a_burst_of_bad_media_hurts_no_one(server: str) -> None:
    alone = [httpx.post(f"{server}/v1/embeddings", json={"input": g}, timeout=60).json()["data"] for g in GOOD]
    siblings = ["a good text", _image(image_url(7))]  # each bad item is sent after these two
    siblings_alone = httpx.post(f"{server}/v1/embeddings", json={"input": siblings}, timeout=60).json()["data"]
    scrape = httpx.get(f"{server}/metrics").text
    rows_before = {lane: metric(scrape, "vllm_srun_rows_total", lane=lane) for lane in ("text", "media")}
    media_before = httpx.get(f"{server}/v1/models").json()["data"][0]["media"]

    # every bad item once, every good request three times, shuffled into one concurrent burst
    plan = [("bad", i) for i in range(len(BAD))] + [("good", j % len(GOOD)) for j in range(3 * len(GOOD))]
    random.Random(0).shuffle(plan)
    bodies = [{"input": [*siblings, BAD[i][0]]} if kind == "bad" else {"input": GOOD[i]} for kind, i in plan]

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server, timeout=120) as client:
            return await asyncio.gather(*(client.post("/v1/embeddings", json=b) for b in bodies))

    for (kind, i), response in zip(plan, asyncio.run(burst())):
        if kind == "good":
            assert response.status_code == 200, response.text
            assert np.abs(_vectors(response.json()["data"]) - _vectors(alone[i])).max() < 1e-5
            continue
        reason = BAD[i][1]
        assert response.status_code == 200, (reason, response.text)
        data = response.json()["data"]
        failed = data[2]
        assert failed["error"] == "invalid_input" and "embedding" not in failed, (reason, failed)
        assert failed["message"].startswith("input[2]: ") and re.search(reason, failed["message"]), failed
        assert "\n" not in failed["message"]
        assert np.abs(_vectors(data[:2]) - _vectors(siblings_alone)).max() < 1e-5

    scrape = httpx.get(f"{server}/metrics").text
    ran = {lane: metric(scrape, "vllm_srun_rows_total", lane=lane) - rows_before[lane] for lane in ("text", "media")}
    sent = [GOOD[i] if kind == "good" else siblings for kind, i in plan]
    assert ran == {lane: sum(_rows(g)[lane] for g in sent) for lane in ("text", "media")}  # a bad item: no row ran
    media_after = httpx.get(f"{server}/v1/models").json()["data"][0]["media"]
    assert media_after["worker_pids"] == media_before["worker_pids"] and media_after["workers_replaced"] == 0
    assert httpx.get(f"{server}/health").status_code == 200
    again = [httpx.post(f"{server}/v1/embeddings", json={"input": g}, timeout=60).json()["data"] for g in GOOD]
    for a, b in zip(alone, again):
        assert np.abs(_vectors(a) - _vectors(b)).max() < 1e-5


def _vectors(data: list[dict[str, Any]]) -> np.ndarray:
    return np.array([d["embedding"] if isinstance(d["embedding"], list) else _floats(d["embedding"]) for d in data])


def _floats(text: str) -> list[float]:
    return np.frombuffer(base64.b64decode(text), dtype="<f4").tolist()


def test_a_body_over_the_limit_is_413_and_the_server_stays(server: str) -> None:
    big = {"input": [_image("data:image/png;base64," + "A" * (65 << 20))]}
    response = httpx.post(f"{server}/v1/embeddings", json=big, timeout=120)
    assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"
    assert httpx.get(f"{server}/health").status_code == 200
