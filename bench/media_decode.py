"""Images/s and videos/s through `vllm-srun serve` with `--media-workers 0` (decode in the request
path) against the default media workers, side by side in one run (R-MEDIA).

A tiny CLIP fixture (32 × 32 pixels in), so decoding and preprocessing — not the model — is what
the server spends its time on. Every request carries a different file (wrk rewrites a few bytes
the decoder never reads; `_wrk.py`), so the decode cache never answers; the result cache is off.
Images: 1280 × 960 JPEG photos-sized; videos: 2 s MP4 (320 × 240, 24 fps), 8 frames sampled.
Rounds alternate the two settings; the ratio is default ÷ 0, per round and as a median.

    python bench/media_decode.py [--seconds 8] [--connections 8] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._load import server
from bench._wrk import media_body, run_wrk, with_comment, with_free_box
from vllm_srun.adapters.media.samples import image_bytes, video_bytes
from vllm_srun.adapters.workers.cpu_budget import front_cpu_budget
from vllm_srun.app.fixtures import write_fixture
from vllm_srun.domain.inputs.media import default_media_workers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    ns = parser.parse_args()
    default = default_media_workers(front_cpu_budget())
    tmp = Path(tempfile.mkdtemp(prefix="srun-media-bench-"))
    package = write_fixture(tmp / "tiny-clip", "multimodal", "clip", 0, golden=False)
    images = [
        media_body("image", with_comment(image_bytes(seed, 1280, 960, fmt="JPEG")), 6, tmp, f"image{seed}.json")
        for seed in range(4)
    ]
    videos = []
    for seed in range(2):
        data, offset = with_free_box(video_bytes(seed, 48, 320, 240, fps=24))
        videos.append(media_body("video", data, offset, tmp, f"video{seed}.json"))
    print(f"CPU budget {front_cpu_budget():g}, default media workers {default}; load {os.getloadavg()}")
    print(f"{'round':>5} {'workers':>8} {'images/s':>9} {'p50 ms':>7} {'videos/s':>9} {'p50 ms':>7} {'errors':>6}")
    rates: dict[int, list[tuple[float, float]]] = {0: [], default: []}
    for r in range(ns.rounds):
        for workers in (0, default):
            flags = ("--media-workers", str(workers), "--result-cache-entries", "0", "--profile", "batching")
            with server(str(package), *flags) as base:
                run_wrk(base, images, connections=2, seconds=1)  # warm-up
                img = run_wrk(base, images, connections=ns.connections, seconds=ns.seconds)
                vid = run_wrk(base, videos, connections=ns.connections, seconds=ns.seconds)
            rates[workers].append((img.rps, vid.rps))
            print(
                f"{r:>5} {workers:>8} {img.rps:>9.1f} {img.p50_ms:>7.1f} {vid.rps:>9.1f} {vid.p50_ms:>7.1f} "
                f"{img.errors + vid.errors:>6}"
            )
    ratio_img = [d[0] / z[0] for z, d in zip(rates[0], rates[default])]
    ratio_vid = [d[1] / z[1] for z, d in zip(rates[0], rates[default])]
    print(
        f"default ({default} media workers) ÷ 0: images/s ×{statistics.median(ratio_img):.2f} "
        f"{[round(x, 2) for x in ratio_img]}, videos/s ×{statistics.median(ratio_vid):.2f} "
        f"{[round(x, 2) for x in ratio_vid]}; load {os.getloadavg()}"
    )


if __name__ == "__main__":
    main()
