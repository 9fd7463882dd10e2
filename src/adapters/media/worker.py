"""One media worker process (R-MEDIA): `python -m vllm_srun.adapters.media.worker FD DECODER`.

It loads the `MediaDecoder` named `module:attribute` (a class built with no arguments), says
`ready` on the socket FD it was given, then answers one job at a time: a pickled
`(method, args)` (`image` or `video_frames`) in, a pickled `(status, value)` out, where status is
`ok` (value: the pixels), `media` (a `MediaError`: bad input, value: its one line) or `error`
(anything else). It never imports torch. It exits when its socket closes (the serving process
stopped or died).
"""

from __future__ import annotations

import importlib
import pickle
import signal
import sys
from multiprocessing.connection import Connection
from typing import Any

from vllm_srun.adapters.media.ports import MediaError

METHODS = frozenset({"image", "video_frames"})
READY = b"ready"


def load_decoder(target: str) -> Any:
    """The decoder `module:attribute` names, built with no arguments."""
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)()


def answer(decoder: Any, blob: bytes) -> tuple[str, Any]:
    method, args = pickle.loads(blob)
    if method not in METHODS:
        return "error", f"unknown media job {method!r}"
    try:
        return "ok", getattr(decoder, method)(*args)
    except MediaError as exc:
        return "media", str(exc)
    except Exception as exc:  # reported to the request that sent it; the worker keeps serving
        return "error", f"{type(exc).__name__}: {exc}"[:300]


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the serving process, which stops us
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
