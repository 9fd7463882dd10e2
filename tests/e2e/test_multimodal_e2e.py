"""The multimodal family end to end: `vllm-srun fixture --family multimodal` writes the package,
`vllm-srun serve` serves it as a real process with its default media workers, the official
`openai` client sends text, image and video items, and a media worker killed from outside is
replaced without a failed request (R-PKG-3, R-API-1, R-MEDIA)."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import numpy as np
import pytest
import torch

from tests.e2e.server import running_server
from tests.waiting import exited, wait_until
from vllm_srun.adapters.media.decoder import PillowAvDecoder
from vllm_srun.adapters.media.samples import image_url, video_url

pytestmark = pytest.mark.slow

CLI = [sys.executable, "-m", "vllm_srun.app.cli"]


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cli") / "tiny-clip"
    done = subprocess.run(
        [*CLI, "fixture", str(out), "--family", "multimodal", "--variant", "clip", "--seed", "5"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(out) and (out / "golden.json").exists()
    assert (out / "preprocessor_config.json").exists()
    return out


@pytest.fixture(scope="module")
def server(package: Path) -> Iterator[str]:
    with running_server(str(package), "--result-cache-entries", "0") as base:
        yield base


def _reference(package: Path, items: list[object], frames: int) -> np.ndarray:
    """Our model in this process, item by item."""
    from vllm_srun.adapters.families.multimodal import media_limits, read_preprocess
    from vllm_srun.adapters.models.dual_encoder import load_dual_encoder
    from vllm_srun.adapters.models.manifest import read_manifest
    from vllm_srun.adapters.models.tokenization import TextTokenizer

    network, tokenizer = load_dual_encoder(package), TextTokenizer.from_folder(package)
    spec = read_preprocess(package, "clip")
    image_limits, video_limits, _ = media_limits(read_manifest(package))
    decoder, out = PillowAvDecoder(), []
    with torch.no_grad():
        for item in items:
            if isinstance(item, str):
                out.append(network.embed_text([tokenizer.encode([item])[0].ids])[0].numpy())
                continue
            assert isinstance(item, dict)
            kind = item["type"]
            data = base64.b64decode(item[kind]["url"].split(",", 1)[1])
            if kind == "image_url":
                pixels = decoder.image(data, image_limits, spec)[None]
                out.append(network.embed_images(torch.from_numpy(pixels))[0].numpy())
            else:
                pixels = decoder.video_frames(data, frames, video_limits, spec)
                mean = network.embed_images(torch.from_numpy(pixels)).numpy().mean(axis=0)
                out.append(mean / np.linalg.norm(mean))
    return np.stack(out)


TEXT = "a photo of a cat"
ITEMS: list[object] = [
    TEXT,
    {"type": "image_url", "image_url": {"url": image_url(21, 120, 80, fmt="JPEG")}},
    {"type": "video_url", "video_url": {"url": video_url(22, 10)}},
]


def test_openai_client_sends_text_images_and_videos(server: str, package: Path) -> None:
    import openai

    client = openai.OpenAI(base_url=f"{server}/v1", api_key="unused")
    got = client.embeddings.create(model="tiny-clip", input=cast(Any, ITEMS))  # the client passes items through
    vectors = np.array([d.embedding for d in got.data])
    assert vectors.shape == (3, 16) and [d.index for d in got.data] == [0, 1, 2]
    assert np.abs(vectors - _reference(package, ITEMS, 4)).max() < 1e-5
    assert got.usage.prompt_tokens == len(TEXT.split()) + 2 + 17 + 4 * 17  # text (+2 specials), image, 4 frames


def test_default_media_workers_and_a_killed_worker_is_replaced(server: str) -> None:
    from vllm_srun.adapters.workers.cpu_budget import front_cpu_budget
    from vllm_srun.domain.inputs.media import default_media_workers

    media = httpx.get(f"{server}/v1/models").json()["data"][0]["media"]
    assert media["workers_source"] == "default" and media["workers"] == default_media_workers(front_cpu_budget())
    assert media["decoding"] == "worker processes" and len(media["worker_pids"]) == media["workers"]
    body = {"input": ITEMS[1:]}
    before = httpx.post(f"{server}/v1/embeddings", json=body, timeout=60).json()["data"]
    for pid in media["worker_pids"]:
        os.kill(pid, signal.SIGKILL)
    wait_until(lambda: all(exited(pid) for pid in media["worker_pids"]), what="the media workers dead")
    fresh = {"input": [{"type": "image_url", "image_url": {"url": image_url(23)}}]}  # not in the decode cache
    assert httpx.post(f"{server}/v1/embeddings", json=fresh, timeout=60).status_code == 200
    assert httpx.post(f"{server}/v1/embeddings", json=body, timeout=60).json()["data"] == before
    after = httpx.get(f"{server}/v1/models").json()["data"][0]["media"]
    assert len(after["worker_pids"]) == media["workers"] and set(after["worker_pids"]).isdisjoint(media["worker_pids"])
    assert httpx.get(f"{server}/health").status_code == 200


def test_media_workers_flag_is_validated_before_any_load() -> None:
    done = subprocess.run([*CLI, "serve", "--media-workers", "-1"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "vllm-srun serve: error: argument --media-workers: expected an integer between 0 and 64, got -1"
    ]


def test_the_docs_example(server: str) -> None:
    example = Path(__file__).resolve().parents[2] / "docs" / "examples" / "multimodal_embeddings.py"
    out = subprocess.run(
        [sys.executable, str(example), server, "tiny-clip"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("16 dimensions; text·image ")
