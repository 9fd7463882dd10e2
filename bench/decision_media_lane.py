"""Text decisions' latency while image decisions load the same worker (R-BAT-6, R-MEDIA): the p50
of one client asking text-only questions alone, then the same client's p50 while other clients
ask questions about images, in one run, on one `vllm-srun serve` of a decision model that reads
images (default: the tiny `qwen3_5_vision` fixture). Target: under image load, text p50 ≤ 2 × alone.

Rows that read media go to the model's `media` lane and text rows to the `text` lane: they never
share a forward, each lane keeps its own cost per token, and the lane estimated cheaper runs first
in a planning round; decoding runs in the media workers. The same measurement is repeated with
`--media-workers 0` (decoding in the request path), and each with the express forward on and off
(`VLLM_SRUN_EXPRESS_FORWARD`, side by side in one run; `--express on` or `off` runs one of them), and
`--lane-yield both` runs the express with the image forwards' yield points on and off side by side
(`VLLM_SRUN_LANE_YIELD`: a slot's image forward pauses at its next block while a text express runs);
`--media-nice 0,10` runs the media workers at each `VLLM_SRUN_MEDIA_NICE`, side by side too. Load is driven by `wrk` (`_wrk.py`): every
image request carries a different JPEG (a comment the decoder never reads is rewritten), so the
decode cache never answers; the result cache is off. Rounds alternate; each prints its ratio.

The profile matters: under `exact` a model that is not batch-invariant (the card's `numerics`,
printed) runs every row in a forward of its own, and a planning round's forwards run in one turn,
so without the express a text row waits for a slot, held by an image forward; with it (on by
default) a text row queued while image forwards hold every slot runs at once beside them (R-BAT-6's
lane express); `--profile batching` merges each lane's rows (docs/decisions.md, "Images and
videos", has the figures).

    python bench/decision_media_lane.py [--model PATH] [--seconds 8] [--image-clients 4] [--size 640x480]
        [--profile exact] [--express both] [--lane-yield on] [--media-nice 0,10]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import sys
import tempfile
import threading
from pathlib import Path
from urllib.request import urlopen

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._cpu_peak import host_kind
from bench._load import server
from bench._wrk import WrkResult, run_wrk, with_comment
from vllm_srun.adapters.media.samples import image_bytes
from vllm_srun.adapters.workers.cpu_budget import front_cpu_budget
from vllm_srun.app.fixtures import write_fixture
from vllm_srun.domain.inputs.media import default_media_workers

QUESTIONS = {
    "billing": {"type": "noul", "instructions": "Is this about billing?"},
    "tone": {"type": "choice", "instructions": "What is the tone?", "criteria": {"calm": None, "angry": None}},
}
TEXT = "I was charged twice for my order and nobody answers my emails. AAAA"
PATH = "/v1/decisions"


def text_body(folder: Path) -> tuple[str, int]:
    """A text-only decisions body, with a mutable quad (its text differs in every request)."""
    body = json.dumps({"state": TEXT, "questions": QUESTIONS})
    path = folder / "text.json"
    path.write_text(body)
    return str(path), body.index("AAAA")


def image_body(jpeg: bytes, folder: Path, name: str) -> tuple[str, int]:
    """A decisions body about one JPEG (with a comment segment whose bytes wrk rewrites)."""
    encoded = base64.b64encode(jpeg).decode()
    body = json.dumps(
        {
            "state": "What does the picture show?",
            "questions": QUESTIONS,
            "images": [f"data:image/jpeg;base64,{encoded}"],
        }
    )
    path = folder / name
    path.write_text(body)
    return str(path), body.index(encoded) + 6 // 3 * 4  # the comment's payload starts at byte 6


def measure(
    base: str, text: list[tuple[str, int]], images: list[tuple[str, int]], ns: argparse.Namespace
) -> tuple[WrkResult, WrkResult, WrkResult]:
    """(text alone, text under image load, the image load itself)."""
    run_wrk(base, text, connections=1, seconds=1, path=PATH)  # warm-up
    run_wrk(base, images, connections=2, seconds=1, path=PATH)
    alone = run_wrk(base, text, connections=1, seconds=ns.seconds, path=PATH)
    loaded: dict[str, WrkResult] = {}

    def load() -> None:
        loaded["images"] = run_wrk(base, images, connections=ns.image_clients, seconds=ns.seconds + 2, path=PATH)

    loader = threading.Thread(target=load)
    loader.start()
    threading.Event().wait(1.0)  # the image load is running before text is measured
    under = run_wrk(base, text, connections=1, seconds=ns.seconds, path=PATH)
    loader.join()
    return alone, under, loaded["images"]


def express_modes(express: str, lane_yield: str) -> dict[str, tuple[str, str]]:
    """The settings to run side by side: label → (VLLM_SRUN_EXPRESS_FORWARD, VLLM_SRUN_LANE_YIELD)."""
    modes: dict[str, tuple[str, str]] = {}
    if express in ("both", "on"):
        if lane_yield in ("both", "on"):
            modes["on+yield"] = ("1", "1")
        if lane_yield in ("both", "off"):
            modes["on"] = ("1", "0")
    if express in ("both", "off"):
        modes["off"] = ("0", "0")
    return modes


def cpu_name() -> str:
    """This host's CPU, with its family and model (`_cpu_peak.host_kind`)."""
    return host_kind()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a decision package that reads images (default: a tiny fixture)")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--image-clients", type=int, default=4)
    parser.add_argument("--size", default="640x480")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--profile", default="exact", help="the serving profile (exact: each question its own row)")
    parser.add_argument("--express", choices=("both", "on", "off"), default="both", help="VLLM_SRUN_EXPRESS_FORWARD")
    parser.add_argument(
        "--lane-yield", choices=("both", "on", "off"), default="on", help="VLLM_SRUN_LANE_YIELD (with the express on)"
    )
    parser.add_argument(
        "--media-nice", default=None, help="VLLM_SRUN_MEDIA_NICE for the media workers, or several side by side: 0,10"
    )
    ns = parser.parse_args()
    width, height = (int(x) for x in ns.size.split("x"))
    nices = tuple(ns.media_nice.split(",")) if ns.media_nice else (os.environ.get("VLLM_SRUN_MEDIA_NICE", ""),)
    tmp = Path(tempfile.mkdtemp(prefix="srun-decision-lane-"))
    model = ns.model or str(write_fixture(tmp / "tiny-qwen3_5-vision", "decision", "qwen3_5_vision", 0, golden=False))
    text = [text_body(tmp)]
    images = [image_body(with_comment(image_bytes(s, width, height, fmt="JPEG")), tmp, f"i{s}.json") for s in range(4)]
    default = default_media_workers(front_cpu_budget())
    print(
        f"model {Path(model).name}; profile {ns.profile}; {ns.image_clients} image clients ({width}×{height} JPEG, each "
        f"request a different file), 1 text client; {len(QUESTIONS)} questions a request; "
        f"media nice {' and '.join(n or 'unset' for n in nices)}"
    )
    print(f"{cpu_name()}, {os.cpu_count()} CPUs, CPU budget {front_cpu_budget():g}; load {os.getloadavg()}")
    print(
        f"{'round':>5} {'media workers':>13} {'express':>9} {'nice':>4} {'text p50 alone':>15} {'under load':>11} {'ratio':>6} "
        f"{'text p90':>9} {'images/s':>9}"
    )
    modes = express_modes(ns.express, ns.lane_yield)
    ratios: dict[tuple[int, str, str], list[float]] = {
        (w, m, n): [] for w in (default, 0) for m in modes for n in (nices if w else nices[:1])
    }
    for r in range(ns.rounds):
        for workers, mode, nice in ratios:
            express, lane_yield = modes[mode]
            os.environ["VLLM_SRUN_EXPRESS_FORWARD"] = express  # the server (and its media workers) inherit them
            os.environ["VLLM_SRUN_LANE_YIELD"] = lane_yield
            os.environ["VLLM_SRUN_MEDIA_NICE"] = nice
            flags = ("--media-workers", str(workers), "--result-cache-entries", "0", "--profile", ns.profile)
            with server(model, *flags) as base:
                card = json.loads(urlopen(f"{base}/v1/models").read())["data"][0]
                threads = card.get("threads") or {}
                if r == 0 and workers == default and mode == next(iter(modes)) and nice == nices[0]:
                    print(
                        f"numerics {card.get('numerics')}, merged forward tokens {card.get('merged_forward_tokens')}, "
                        f"concurrent forwards {threads.get('concurrent_forwards')}, forward nice "
                        f"{threads.get('forward_nice')}"
                    )
                alone, under, load = measure(base, text, images, ns)
            ratio = under.p50_ms / alone.p50_ms
            ratios[workers, mode, nice].append(ratio)
            errors = alone.errors + under.errors + load.errors
            on = ("on+yield" if threads.get("lane_yield") else "on") if threads.get("express_forward") else "off"
            print(
                f"{r:>5} {workers:>13} {on:>9} {nice or '-':>4} {alone.p50_ms:>12.2f} ms {under.p50_ms:>8.2f} ms {ratio:>5.2f}× "
                f"{under.p90_ms:>6.2f} ms {load.rps:>9.1f}" + (f"  (errors {errors})" if errors else "")
            )
    for (workers, mode, nice), got in ratios.items():
        verdict = "ok" if statistics.median(got) <= 2.0 else "over the 2× target"
        print(
            f"media workers {workers} (nice {nice or '-'}), express {mode}: text p50 under "
            "image load ÷ "
            f"alone, median ×{statistics.median(got):.2f} ({verdict})"
        )
    print(f"load {os.getloadavg()}")


if __name__ == "__main__":
    main()
