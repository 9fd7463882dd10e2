"""Bad audio never hurts anyone else (R-API-9, R-MEDIA), against a real `vllm-srun serve` process
with its media worker: one concurrent burst mixes every kind of bad audio a hostile client can
send (bad base64, corrupt or truncated files, a format that lies, zero length, over-long, absurd
sample rates, no audio stream) with good requests. Each bad item fails in its own slot
(`invalid_input`, naming its input and why) and costs no forward, while its request's good items
are answered as they are alone (the upstream contract's per-item errors); each good request gets
the answer it gets alone; the media worker is untouched. All audio is made here."""

from __future__ import annotations

import asyncio
import io
import random
import re
import struct
import subprocess
import sys
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import httpx
import numpy as np
import pytest

from tests.e2e.server import running_server
from tests.prometheus_text import metric
from vllm_srun.adapters.media.audio_samples import audio_bytes, audio_item, input_audio, signal

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    out = tmp_path_factory.mktemp("hostile") / "tiny-whisper"
    cmd = [sys.executable, "-m", "vllm_srun.app.cli", "fixture", str(out), "--family", "audio", "--variant", "whisper"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    with running_server(str(out), "--media-workers", "1", "--result-cache-entries", "0") as base:
        yield base


def _wav_header(rate: int, channels: int = 1, size: int = 0) -> bytes:
    fmt = struct.pack("<HHIIHH", 1, channels, rate, (rate * channels * 2) % 2**32, channels * 2, 16)
    riff = b"RIFF" + struct.pack("<I", 36 + size) + b"WAVE"
    return riff + b"fmt " + struct.pack("<I", 16) + fmt + b"data" + struct.pack("<I", size)


def _video_only_ogg() -> bytes:
    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format="ogg") as out:
        stream: Any = out.add_stream("libvpx", rate=Fraction(10, 1))
        stream.width = stream.height = 16
        for _ in range(3):
            for packet in stream.encode(av.VideoFrame.from_ndarray(np.zeros((16, 16, 3), np.uint8), format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


WAV = audio_bytes(signal("tone", 1.0, 16000, 1), 16000, "wav")
OGG = audio_bytes(signal("chord", 1.0, 16000, 2), 16000, "ogg")
BAD: list[tuple[dict[str, Any], str]] = [
    ({"type": "input_audio", "input_audio": {"data": "not*base64!", "format": "wav"}}, "invalid base64"),
    ({"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}, "the audio is empty"),
    (input_audio(WAV[: len(WAV) // 3], "wav"), "truncated"),
    (input_audio(b"RIFF\0\0\0\0WAVEfmt " + b"\0" * 64, "wav"), "unreadable WAV file"),
    (input_audio(OGG[:40] + bytes(range(256)) * 8, "ogg"), "unreadable Ogg file|corrupt"),
    (input_audio(WAV, "flac"), "the data is WAV, not flac as its format says"),
    (input_audio(b"%PDF-1.7\n" + b"x" * 100, "mp3"), "not audio in a supported format"),
    (input_audio(_wav_header(16000), "wav"), "the audio has no samples"),
    (input_audio(audio_bytes(signal("noise", 5.0, 8000), 8000, "wav"), "wav"), "over the limit of 2 s"),
    (input_audio(_wav_header(1, size=400) + b"\0" * 400, "wav"), "declares 1 samples per second"),
    (input_audio(_wav_header(2_000_000_000, size=400) + b"\1" * 400, "wav"), "declares 2000000000 samples"),
    (input_audio(_video_only_ogg(), "ogg"), "no audio stream"),
]
GOOD: list[list[Any]] = [
    [audio_item("tone", 1.2, 16000, "wav", 3)],
    [audio_item("noise", 0.7, 44100, "flac", 4), audio_item("chord", 1.0, 48000, "ogg", 5)],
    [audio_item("clipped", 0.9, 22050, "mp3", 6)],
]


def test_a_burst_of_bad_audio_hurts_no_one(server: str) -> None:
    alone = [httpx.post(f"{server}/v1/embeddings", json={"input": g}, timeout=60).json()["data"] for g in GOOD]
    good_item = audio_item("tone", 0.4, 16000, "wav", 7)
    pair = httpx.post(f"{server}/v1/embeddings", json={"input": [good_item, good_item]}, timeout=60).json()["data"]
    good_alone = [d["embedding"] for d in pair]
    rows_before = metric(httpx.get(f"{server}/metrics").text, "vllm_srun_rows_total", lane="audio")
    media_before = httpx.get(f"{server}/v1/models").json()["data"][0]["media"]

    # every bad item and every good request once: 15 at once, within the 16 large bodies prepared at a time
    plan = [("bad", i) for i in range(len(BAD))] + [("good", j) for j in range(len(GOOD))]
    random.Random(0).shuffle(plan)
    bodies = [{"input": [good_item, good_item, BAD[i][0]]} if kind == "bad" else {"input": GOOD[i]} for kind, i in plan]

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server, timeout=120) as client:
            return await asyncio.gather(*(client.post("/v1/embeddings", json=b) for b in bodies))

    for (kind, i), response in zip(plan, asyncio.run(burst())):
        if kind == "good":
            assert response.status_code == 200, response.text
            got = np.array([d["embedding"] for d in response.json()["data"]])
            assert np.abs(got - np.array([d["embedding"] for d in alone[i]])).max() < 1e-5
            continue
        assert response.status_code == 200, (BAD[i][1], response.text)
        data = response.json()["data"]
        failed = data[2]
        assert failed["error"] == "invalid_input" and "embedding" not in failed, (BAD[i][1], failed)
        assert failed["message"].startswith("input[2]: ") and re.search(BAD[i][1], failed["message"]), failed
        assert "\n" not in failed["message"]
        assert np.abs(np.array([d["embedding"] for d in data[:2]]) - np.array(good_alone)).max() < 1e-5

    ran = metric(httpx.get(f"{server}/metrics").text, "vllm_srun_rows_total", lane="audio") - rows_before
    bad_requests = sum(kind == "bad" for kind, _ in plan)
    good_rows = sum(len(GOOD[i]) for kind, i in plan if kind == "good")
    assert ran == good_rows + 2 * bad_requests  # a bad item: no row ran; its siblings': theirs
    media_after = httpx.get(f"{server}/v1/models").json()["data"][0]["media"]
    assert media_after["worker_pids"] == media_before["worker_pids"] and media_after["workers_replaced"] == 0
    assert httpx.get(f"{server}/health").status_code == 200
