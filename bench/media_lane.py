"""Text latency while images load the same worker (R-BAT-6, R-MEDIA): the text p50 of one client
alone, then the text p50 of the same client while other clients send images, in one run, on
one `vllm-srun serve` of a multimodal model. Target: under image load, text p50 ≤ 2 × alone.

Text rows go to the `text` lane and image rows to the `media` lane: they never share a forward,
and the lane estimated cheaper runs first in a round; decoding runs in the media workers. The
same measurement is repeated with `--media-workers 0` (decoding in the request path) for
comparison. Load is driven by `wrk` (`_wrk.py`): every image request carries a different JPEG,
so the decode cache never answers; the result cache is off.

    python bench/media_lane.py [--model PATH] [--seconds 8] [--image-clients 4] [--size 640x480]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._load import server
from bench._wrk import WrkResult, media_body, run_wrk, text_body, with_comment
from vllm_srun.adapters.media.samples import image_bytes
from vllm_srun.adapters.workers.cpu_budget import front_cpu_budget
from vllm_srun.app.fixtures import write_fixture
from vllm_srun.domain.inputs.media import default_media_workers

TEXT = "a photo of the small red cat on a blue house by the sea at night"


def measure(
    base: str, text: list[tuple[str, int]], images: list[tuple[str, int]], ns: argparse.Namespace
) -> tuple[WrkResult, WrkResult, WrkResult]:
    """(text alone, text under image load, the image load itself)."""
    run_wrk(base, text, connections=1, seconds=1, mutate=False)  # warm-up
    run_wrk(base, images, connections=2, seconds=1)
    alone = run_wrk(base, text, connections=1, seconds=ns.seconds, mutate=False)
    loaded: dict[str, WrkResult] = {}

    def load() -> None:
        loaded["images"] = run_wrk(base, images, connections=ns.image_clients, seconds=ns.seconds + 2)

    loader = threading.Thread(target=load)
    loader.start()
    threading.Event().wait(1.0)  # the image load is running before text is measured
    under = run_wrk(base, text, connections=1, seconds=ns.seconds, mutate=False)
    loader.join()
    return alone, under, loaded["images"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a multimodal package (default: a tiny CLIP fixture)")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--image-clients", type=int, default=4)
    parser.add_argument("--size", default="640x480")
    ns = parser.parse_args()
    width, height = (int(x) for x in ns.size.split("x"))
    tmp = Path(tempfile.mkdtemp(prefix="srun-lane-bench-"))
    model = ns.model or str(write_fixture(tmp / "tiny-clip", "multimodal", "clip", 0, golden=False))
    text = [text_body(tmp, TEXT)]
    images = [
        media_body("image", with_comment(image_bytes(s, width, height, fmt="JPEG")), 6, tmp, f"i{s}.json")
        for s in range(4)
    ]
    default = default_media_workers(front_cpu_budget())
    print(f"model {Path(model).name}; {ns.image_clients} image clients ({width}×{height} JPEG), 1 text client")
    print(f"CPU budget {front_cpu_budget():g}; load {os.getloadavg()}")
    print(
        f"{'media workers':>13} {'text p50 alone':>15} {'under load':>11} {'ratio':>6} {'text p90':>9} {'images/s':>9}"
    )
    for workers in (default, 0):
        flags = ("--media-workers", str(workers), "--result-cache-entries", "0", "--profile", "batching")
        with server(model, *flags) as base:
            alone, under, load = measure(base, text, images, ns)
        ratio = under.p50_ms / alone.p50_ms
        verdict = "ok" if ratio <= 2.0 else "over the 2× target"
        print(
            f"{workers:>13} {alone.p50_ms:>12.2f} ms {under.p50_ms:>8.2f} ms {ratio:>5.2f}× "
            f"{under.p90_ms:>6.2f} ms {load.rps:>9.1f}  {verdict}"
            + (
                f" (errors {alone.errors + under.errors + load.errors})"
                if alone.errors + under.errors + load.errors
                else ""
            )
        )
    print(f"load {os.getloadavg()}")


if __name__ == "__main__":
    main()
