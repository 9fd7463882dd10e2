"""Text latency while audio loads the same worker (R-BAT-6, R-MEDIA): the text p50 of one client
alone, then under concurrent audio load, in one run, on one `vllm-srun serve` holding a text
encoder and a Whisper-encoder audio model. Target: under audio load, text p50 ≤ 2 × alone.

Audio rows go to the audio model's `audio` lane, with their own cost per token; decoding and
log-mel features run in the media workers. The measurement is repeated with `--media-workers 0`
(decoding in the request path); the audio requests per second of the two runs are the decode
rates compared. Load is driven by `wrk` (`_wrk.py`): every audio request carries different
samples (wrk mutates bytes inside the WAV data), so the decode cache never answers; the result
cache is off.

    python bench/audio_lane.py [--text-model PATH] [--audio-model PATH] [--seconds 8]
        [--audio-clients 4] [--audio-seconds 1.5]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._load import server
from bench._wrk import WrkResult, run_wrk
from vllm_srun.adapters.media.audio_samples import audio_bytes, signal
from vllm_srun.adapters.workers.cpu_budget import front_cpu_budget
from vllm_srun.app.fixtures import write_fixture
from vllm_srun.domain.inputs.media import default_media_workers

TEXT = "a photo of the small red cat on a blue house by the sea at night"


def bodies(
    folder: Path, text_model: str, audio_model: str, seconds: float
) -> tuple[tuple[str, int], list[tuple[str, int]]]:
    """The text body and four audio bodies: (path, index of a mutable base64 quad)."""
    text = json.dumps({"model": text_model, "input": [TEXT + " AAAA"]})
    (folder / "text.json").write_text(text)
    audio = []
    for seed in range(4):
        wav = audio_bytes(signal(("tone", "chord", "noise", "clipped")[seed], seconds, 16000, seed), 16000, "wav")
        encoded = base64.b64encode(wav).decode()
        body = json.dumps(
            {
                "model": audio_model,
                "input": [{"type": "input_audio", "input_audio": {"data": encoded, "format": "wav"}}],
            }
        )
        path = folder / f"audio{seed}.json"
        path.write_text(body)
        audio.append((str(path), body.index(encoded) + 300 // 3 * 4))  # inside the samples, past the header
    return (str(folder / "text.json"), text.index("AAAA")), audio


def measure(
    base: str, text: list[tuple[str, int]], audio: list[tuple[str, int]], ns: argparse.Namespace
) -> tuple[WrkResult, WrkResult, WrkResult]:
    """(text alone, text under audio load, the audio load itself)."""
    run_wrk(base, text, connections=1, seconds=1, mutate=False)  # warm-up
    run_wrk(base, audio, connections=2, seconds=1)
    alone = run_wrk(base, text, connections=1, seconds=ns.seconds, mutate=False)
    loaded: dict[str, WrkResult] = {}

    def load() -> None:
        loaded["audio"] = run_wrk(base, audio, connections=ns.audio_clients, seconds=ns.seconds + 2)

    loader = threading.Thread(target=load)
    loader.start()
    threading.Event().wait(1.0)  # the audio load is running before text is measured
    under = run_wrk(base, text, connections=1, seconds=ns.seconds, mutate=False)
    loader.join()
    return alone, under, loaded["audio"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--text-model", default=None, help="a text encoder package (default: a tiny fixture)")
    parser.add_argument("--audio-model", default=None, help="an audio package (default: the tiny Whisper fixture)")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--audio-clients", type=int, default=4)
    parser.add_argument("--audio-seconds", type=float, default=1.5, help="length of each audio input")
    ns = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="srun-audio-lane-bench-"))
    text_model = ns.text_model or str(write_fixture(tmp / "tiny-embed", "encoder", "embed", 0, golden=False))
    audio_model = ns.audio_model or str(write_fixture(tmp / "tiny-whisper", "audio", "whisper", 0, golden=False))
    text, audio = bodies(tmp, Path(text_model).name, Path(audio_model).name, ns.audio_seconds)
    default = default_media_workers(front_cpu_budget())
    print(f"models {Path(text_model).name} + {Path(audio_model).name}; {ns.audio_clients} audio clients")
    print(
        f"({ns.audio_seconds:g} s WAV at 16 kHz), 1 text client; CPU budget {front_cpu_budget():g}; load {os.getloadavg()}"
    )
    print(
        f"{'media workers':>13} {'text p50 alone':>15} {'under load':>11} {'ratio':>6} {'text p90':>9} {'audio/s':>8}"
    )
    for workers in (default, 0):
        flags = ("--media-workers", str(workers), "--result-cache-entries", "0", "--profile", "batching")
        with server(text_model, audio_model, *flags) as base:
            alone, under, load = measure(base, [text], audio, ns)
        ratio = under.p50_ms / alone.p50_ms
        errors = alone.errors + under.errors + load.errors
        print(
            f"{workers:>13} {alone.p50_ms:>12.2f} ms {under.p50_ms:>8.2f} ms {ratio:>5.2f}× "
            f"{under.p90_ms:>6.2f} ms {load.rps:>8.1f}  {'ok' if ratio <= 2.0 else 'over the 2× target'}"
            + (f" (errors {errors})" if errors else "")
        )
    print(f"load {os.getloadavg()}")


if __name__ == "__main__":
    main()
