"""One media worker process (R-MEDIA): `python -m vllm_srun.adapters.media.worker FD DECODER`.

It loads the `MediaDecoder` named `module:attribute` (a class built with no arguments), says
`ready` on the socket FD it was given, then answers one job at a time: a pickled `MediaJob`
(`ImageJob`, `VideoJob` or `AudioJob`, run by `contracts.media.decode`) in, a pickled `(status, value)` out,
where status is `ok` (value: the pixels), `media` (a `MediaError`: bad input, value: its one
line) or `error` (anything else). It never imports torch. It exits when its socket closes (the
serving process stopped or died).

`VLLM_SRUN_MEDIA_NICE` (0..19, default 0) lowers the worker's CPU priority by that nice increment
when it starts: set above the forward threads' (`VLLM_SRUN_FORWARD_NICE`, 5), decoding yields the
cores to the forwards (and to the express forward, R-BAT-6) when both are ready. Anything else
is refused in one line (the worker does not start).
"""

from __future__ import annotations

import importlib
import os
import pickle
import signal
import sys
from collections.abc import Mapping
from multiprocessing.connection import Connection

from vllm_srun.adapters.contracts.media import MEDIA_JOBS, MediaDecoder, MediaError, decode
from vllm_srun.domain.worker.threads import nice_increment

READY = b"ready"
MEDIA_NICE_ENV = "VLLM_SRUN_MEDIA_NICE"
Answer = tuple[str, object]  # (status, the pixels or a one-line message)


def load_decoder(target: str) -> MediaDecoder:
    """The decoder `module:attribute` names, built with no arguments; TypeError when what it
    names does not decode (no `image` and `video_frames`)."""
    module, _, attribute = target.partition(":")
    decoder = getattr(importlib.import_module(module), attribute)()
    if not isinstance(decoder, MediaDecoder):
        raise TypeError(f"{target} is not a MediaDecoder (it needs image and video_frames)")
    return decoder


def answer(decoder: MediaDecoder, blob: bytes) -> Answer:
    job = pickle.loads(blob)
    if not isinstance(job, MEDIA_JOBS):
        return "error", f"unknown media job {type(job).__name__}"
    try:
        return "ok", decode(decoder, job)
    except MediaError as exc:
        return "media", str(exc)
    except Exception as exc:  # reported to the request that sent it; the worker keeps serving
        return "error", f"{type(exc).__name__}: {exc}"[:300]


def media_nice(env: Mapping[str, str]) -> int:
    """The nice increment a media worker starts with (`VLLM_SRUN_MEDIA_NICE`, 0..19, default 0);
    ValueError with a one-line reason for anything else."""
    return nice_increment(env, MEDIA_NICE_ENV, 0)


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the serving process, which stops us
    nice = media_nice(os.environ)
    if nice and hasattr(os, "nice"):
        os.nice(nice)
    conn = Connection(int(argv[0]))
    decoder = load_decoder(argv[1])
    conn.send_bytes(READY)
    while True:
        try:
            blob = conn.recv_bytes()
        except (EOFError, OSError):
            return 0
        conn.send_bytes(pickle.dumps(answer(decoder, blob), protocol=pickle.HIGHEST_PROTOCOL))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
