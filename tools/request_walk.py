"""Count the modules of vllm_srun that one `POST /v1/embeddings` visits in a worker.

    python tools/request_walk.py [--text TEXT] [--port PORT] [--verbose] [--save FILE] [-- SERVE ARGS]
    python tools/request_walk.py --load FILE [--verbose]

The first form serves in this process (`vllm-srun serve --port PORT SERVE ARGS`: the default
model, all-MiniLM-L6-v2, unless SERVE ARGS name another), waits until `/health` answers, sends
one warm-up request (another text: no result-cache hit), then records the calls of one request
for TEXT and stops the server. `--save` writes the recorded calls as JSON, `--load` reads such
a file back instead of serving.

What it counts. A profile hook records every call of a function of ours (a module under
`vllm_srun`) from just before the request is sent until 0.3 s after its answer arrived, with its
nearest caller of ours: code of other packages (litestar, uvicorn, asyncio, torch) is
transparent, so a handler litestar calls is the child of whatever of ours called litestar, or a
root. Work handed to another thread (`DeviceThread.hand_off`, `Offload.hand_off`) hangs under that
hand-off. The call tree is then walked the way a reader follows the code: depth first, back in
the caller after each call that led anywhere. Each step is in one module; consecutive steps in
the same module are one *stay*; *rooms* are the distinct modules; *returns* = stays − rooms,
the times the reader comes back to a module already seen. Left out: the clock and metrics
modules (leaves), and the frames of comprehensions and dataclass-generated `__init__`s (their
calls count as their caller's). An architecture's layer loop (`*.packed_forward`) counts one
layer: its longest run of repeated calls is kept once.

Figures depend on the model, the engine's kernels (oneDNN linears, the C++ attention op) and
the request's size (inline or offloaded preparation); compare walks made on one machine. This
is a measuring tool for design reviews, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

PACKAGE = "vllm_srun"
LEAF_MODULES = frozenset({"adapters.clock", "adapters.prometheus"})  # time and metrics: left out
HAND_OFFS = frozenset({"DeviceThread.hand_off", "Offload.hand_off"})  # work that continues on another thread
TRANSPARENT = ("<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>", "__create_fn__")
LAYER_LOOP = "packed_forward"
SETTLE_S = 0.3  # after the answer: the connection's bookkeeping (keep-alive, close)
Call = tuple[str, str, str, int, int | None]  # (thread, module, function, frame id, caller's frame id)


class Recorder:
    """The profile hook: every call of ours while `on`, with its nearest caller of ours."""

    def __init__(self) -> None:
        self.on = False
        self.calls: list[Call] = []
        self.quiet_thread: int | None = None  # the client's thread: its calls are not the server's
        self._alive: list[FrameType] = []  # frames kept alive while recording: their ids stay unique

    def hook(self, frame: FrameType, event: str, arg: Any) -> None:
        if not self.on or event != "call" or threading.get_ident() == self.quiet_thread:
            return
        module = frame.f_globals.get("__name__", "")
        if not module.startswith(PACKAGE + "."):
            return
        caller = frame.f_back
        while caller is not None and not caller.f_globals.get("__name__", "").startswith(PACKAGE + "."):
            caller = caller.f_back
        self._alive.append(frame)
        if caller is not None:
            self._alive.append(caller)
        name = threading.current_thread().name
        self.calls.append((name, module, frame.f_code.co_qualname, id(frame), id(caller) if caller else None))

    def install(self) -> None:
        threading.setprofile(self.hook)
        sys.setprofile(self.hook)

    def stop(self) -> None:
        """Stop recording (the hooks stay, idle, on threads other than this one)."""
        self.on = False
        sys.setprofile(None)
        threading.setprofile(None)


@dataclass
class Node:
    module: str  # without the `vllm_srun.` prefix
    function: str
    kids: list[Node] = field(default_factory=list)


def call_tree(calls: Sequence[Sequence[Any]]) -> list[Node]:
    """The roots of the recorded calls, in the order they first ran (a coroutine resumed is the
    same frame: it counts once)."""
    nodes: dict[int, Node] = {}
    roots: list[Node] = []
    hand_off: Node | None = None
    for thread, module, function, frame_id, caller_id in calls:
        if frame_id in nodes:
            continue
        node = Node(module.removeprefix(PACKAGE + "."), function)
        nodes[frame_id] = node
        if caller_id in nodes:
            nodes[caller_id].kids.append(node)
        elif thread != "MainThread" and hand_off is not None:
            hand_off.kids.append(node)  # a worker thread's call: under the hand-off that sent it there
        else:
            roots.append(node)
        if function in HAND_OFFS:
            hand_off = node
    return roots


def one_layer(kids: list[Node]) -> list[Node]:
    """KIDS with their longest run of a repeated block of calls (the layers) kept once."""
    sig = [(k.module, k.function) for k in kids]
    best = (0, 0, 0)  # (calls covered, start, block length)
    for start in range(len(sig)):
        for size in range(1, (len(sig) - start) // 2 + 1):
            end = start + size
            while sig[end : end + size] == sig[start : start + size]:
                end += size
            if end - start > size and end - start > best[0]:
                best = (end - start, start, size)
    covered, start, size = best
    if not covered:
        return kids
    return kids[: start + size] + kids[start + covered :]


def walk(roots: Sequence[Node]) -> list[tuple[str, str]]:
    """The reader's steps: (module, function), depth first, back in the caller after each call
    that led anywhere."""
    steps: list[tuple[str, str]] = []

    def visit(node: Node, caller: tuple[str, str] | None) -> None:
        if node.module in LEAF_MODULES:
            return
        here = caller  # a transparent frame's calls return to its caller's step
        if not any(t in node.function for t in TRANSPARENT):
            here = (node.module, node.function)
            steps.append(here)
        kids = one_layer(node.kids) if node.function.endswith(LAYER_LOOP) else node.kids
        for kid in kids:
            before = len(steps)
            visit(kid, here)
            if len(steps) > before and here is not None:
                steps.append(here)

    for root in roots:
        visit(root, None)
    return steps


def stays(steps: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """Consecutive steps in one module merged: (module, the function the stay began in)."""
    out: list[tuple[str, str]] = []
    for module, function in steps:
        if not out or out[-1][0] != module:
            out.append((module, function))
    return out


def summary(calls: Sequence[Sequence[Any]]) -> tuple[int, int, int, list[tuple[str, str]]]:
    """(stays, rooms, returns, the stays) of the recorded CALLS."""
    visits = stays(walk(call_tree(calls)))
    rooms = len({module for module, _ in visits})
    return len(visits), rooms, len(visits) - rooms, visits


def _post(url: str, text: str) -> None:
    body = json.dumps({"input": text}).encode()
    request = urllib.request.Request(url, data=body, headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        response.read()


def _client(recorder: Recorder, port: int, text: str, outcome: dict[str, str], done: threading.Event) -> None:
    """Wait for the server, warm it up, record one request, then stop the server (SIGINT)."""
    recorder.quiet_thread = threading.get_ident()
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                with urllib.request.urlopen(base + "/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{base}/health did not answer within 600 s")
            time.sleep(0.5)
        _post(base + "/v1/embeddings", "a warm-up text, not the recorded one")
        time.sleep(0.5)
        recorder.on = True
        _post(base + "/v1/embeddings", text)
        time.sleep(SETTLE_S)
        recorder.stop()
    except Exception as exc:  # the report says why; the server still stops
        recorder.stop()
        outcome["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        done.set()
        os.kill(os.getpid(), signal.SIGINT)


def record(port: int, text: str, serve_args: Sequence[str]) -> list[Call]:
    """Serve in this process and record one request (module doc)."""
    from vllm_srun.app.cli import main as cli_main

    recorder, outcome, done = Recorder(), dict[str, str](), threading.Event()
    recorder.install()
    threading.Thread(target=_client, args=(recorder, port, text, outcome, done), daemon=True).start()
    status: int | str | None = None
    try:
        status = cli_main(["serve", "--port", str(port), *serve_args])
    except KeyboardInterrupt:
        pass
    except SystemExit as exc:  # argparse's refusal of SERVE ARGS
        status = exc.code
    finally:
        recorder.stop()
    if not done.is_set():
        raise SystemExit(f"request_walk: the server stopped (exit status {status}) before the request was recorded")
    if "error" in outcome:
        raise SystemExit(f"request_walk: {outcome['error']}")
    if not recorder.calls:
        raise SystemExit("request_walk: no call of ours was recorded")
    return recorder.calls


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--text", default="A man is eating food.", help="the recorded request's input")
    parser.add_argument("--port", type=int, default=8931)
    parser.add_argument("--save", metavar="FILE", help="write the recorded calls here (JSON)")
    parser.add_argument("--load", metavar="FILE", help="walk calls saved by --save instead of serving")
    parser.add_argument("--verbose", "-v", action="store_true", help="list every stay")
    parser.add_argument("serve_args", nargs="*", help="after --: arguments of `vllm-srun serve`")
    ns = parser.parse_args(argv)
    if ns.load:
        try:
            with open(ns.load, encoding="utf-8") as f:
                calls = json.load(f)
        except (OSError, json.JSONDecodeError) as exc:
            parser.error(f"cannot read {ns.load}: {exc}")
    else:
        calls = record(ns.port, ns.text, ns.serve_args)
        if ns.save:
            with open(ns.save, "w", encoding="utf-8") as f:
                json.dump(calls, f)
    count, rooms, returns, visits = summary(calls)
    print(f"POST /v1/embeddings: {count} stays in {rooms} modules, {returns} returns")
    if ns.verbose:
        for module, function in visits:
            print(f"  {module:42s} {function}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
