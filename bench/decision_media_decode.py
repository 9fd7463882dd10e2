"""Decode once (R-PERF-4) for decision models that read videos and images: the same video (and
image) asked about twice, with other questions and another state the second time, through one
`vllm-srun serve` (default: the tiny `qwen3_5_vision` fixture). The second request finds the
preprocessed frames in the decode cache: it decodes nothing (the card's `media.decode_cache` hits
and misses, `/metrics`' decode-time histogram count) and answers sooner by the decode time.

Videos: MP4 (mpeg4), 640 × 360 at 24 frames a second, 10 s by default (sampled at 2 frames a
second: 20 frames); images: 1280 × 960 JPEG. The result cache is off, so every answer is computed;
each request runs `--repeats` times with fresh media (new seeds) and the medians are printed.

    python bench/decision_media_decode.py [--model PATH] [--seconds 10] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._load import server
from bench.decision_media_lane import cpu_name
from vllm_srun.adapters.media.samples import data_url, image_bytes, video_bytes
from vllm_srun.app.fixtures import write_fixture

FIRST = {
    "state": "What happens in the clip?",
    "questions": {"cat": {"type": "noul", "instructions": "Is there a cat?"}},
}
SECOND = {
    "state": "Describe it.",
    "questions": {"tone": {"type": "choice", "instructions": "Which mood?", "criteria": {"calm": None, "busy": None}}},
}


def sample(text: str, name: str, kind: str) -> float:
    """The value of the series NAME{kind=KIND} in a Prometheus text (0 when it is not there)."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") and f'kind="{kind}"' in line
    )


def decodes(base: str, kind: str) -> tuple[float, float]:
    """(decodes so far, their seconds) of KIND from /metrics."""
    text = httpx.get(f"{base}/metrics", timeout=30).text
    return (
        sample(text, "vllm_srun_media_decode_duration_seconds_count", kind),
        sample(text, "vllm_srun_media_decode_duration_seconds_sum", kind),
    )


def timed(base: str, body: dict) -> float:
    started = time.perf_counter()
    got = httpx.post(f"{base}/v1/decisions", json=body, timeout=600)
    got.raise_for_status()
    return (time.perf_counter() - started) * 1000


def one(base: str, kind: str, url: str) -> tuple[float, float, float, float]:
    """(first ms, second ms, decodes by the first, decodes by the second) for one medium."""
    key = "videos" if kind == "video" else "images"
    count0, _ = decodes(base, kind)
    first = timed(base, {**FIRST, key: [url]})
    count1, _ = decodes(base, kind)
    second = timed(base, {**SECOND, key: [url]})
    count2, _ = decodes(base, kind)
    return first, second, count1 - count0, count2 - count1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--seconds", type=int, default=10, help="video length")
    parser.add_argument("--repeats", type=int, default=3)
    ns = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="srun-decision-decode-"))
    model = ns.model or str(write_fixture(tmp / "tiny-qwen3_5-vision", "decision", "qwen3_5_vision", 0, golden=False))
    print(f"model {Path(model).name}; {cpu_name()}, {os.cpu_count()} CPUs; load {os.getloadavg()}")
    with server(model, "--result-cache-entries", "0") as base:
        media = httpx.get(f"{base}/v1/models").json()["data"][0]["media"]
        print(f"media workers {media['workers']} ({media['decoding']})")
        timed(base, {**FIRST, "images": [data_url(image_bytes(99, 64, 64, fmt="JPEG"), "image/jpeg")]})  # warm-up
        print(f"{'medium':>6} {'first ms':>9} {'second ms':>10} {'decodes 1st':>11} {'decodes 2nd':>11}")
        rows: dict[str, list[tuple[float, float, float, float]]] = {"video": [], "image": []}
        for r in range(ns.repeats):
            video = video_bytes(100 + r, ns.seconds * 24, 640, 360, fps=24)
            image = image_bytes(200 + r, 1280, 960, fmt="JPEG")
            for kind, url in (("video", data_url(video, "video/mp4")), ("image", data_url(image, "image/jpeg"))):
                got = one(base, kind, url)
                rows[kind].append(got)
                print(f"{kind:>6} {got[0]:>9.1f} {got[1]:>10.1f} {got[2]:>11g} {got[3]:>11g}")
        cache = httpx.get(f"{base}/v1/models").json()["data"][0]["media"]["decode_cache"]
    for kind, got in rows.items():
        first, second = statistics.median(g[0] for g in got), statistics.median(g[1] for g in got)
        print(
            f"{kind}: first {first:.0f} ms (decodes {sum(g[2] for g in got):g}), second {second:.0f} ms "
            f"(decodes {sum(g[3] for g in got):g}); second ÷ first {second / first:.2f}"
        )
    print(f"decode cache: {cache}; load {os.getloadavg()}")


if __name__ == "__main__":
    main()
