"""One managed worker process: spawn, relay its output, notice its exit at once, stop it.

- The worker runs in its own session, so a Ctrl-C in the terminal reaches only the front,
  which then drains and stops its workers itself; on Linux it also gets SIGTERM if the
  front dies without stopping it (PR_SET_PDEATHSIG).
- Its exit is noticed through a pidfd (Linux ≥ 5.3) on the event loop, or a waiting thread
  elsewhere, so requests and probes learn of a crash without polling.
- Its output is relayed to the front's stderr, each line prefixed with the replica id; the
  last lines are kept so an exit can say why (e.g. a refused argument).
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

PR_SET_PDEATHSIG = 1
KEPT_LINES = 8


try:  # resolved here, not in the child: between fork and exec nothing may take a lock
    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None
except (OSError, AttributeError):  # pragma: no cover
    _PRCTL = None


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, int(signal.SIGTERM))


class _LineRelay(asyncio.Protocol):
    def __init__(self, prefix: str, kept: collections.deque[str], out: Callable[[str], None]) -> None:
        self.prefix, self.kept, self.out = prefix, kept, out
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        *lines, self.buffer = self.buffer.split(b"\n")
        for raw in lines:
            self._line(raw)

    def eof_received(self) -> bool:
        if self.buffer:
            self._line(self.buffer)
            self.buffer = b""
        return False

    def _line(self, raw: bytes) -> None:
        line = raw.decode("utf-8", "replace").rstrip()
        if line:
            self.kept.append(line)
            self.out(f"[{self.prefix}] {line}")


def _stderr(line: str) -> None:
    sys.stderr.write(line + "\n")  # one write (not print's two): it never runs into a log line
    sys.stderr.flush()


class WorkerProcess:
    def __init__(
        self,
        name: str,
        command: list[str],
        *,
        env: dict[str, str] | None = None,
        output: Callable[[str], None] = _stderr,
    ) -> None:
        self.name = name
        self.command = command
        self.env = env
        self.output = output
        self.last_lines: collections.deque[str] = collections.deque(maxlen=KEPT_LINES)
        self.popen: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.exited: asyncio.Future[int] | None = None

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else None

    @property
    def running(self) -> bool:
        return self.exited is not None and not self.exited.done()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.last_lines.clear()
        self.popen = subprocess.Popen(  # noqa: ASYNC220 - fork+exec returns at once; the exit is awaited
            self.command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=self.env,
            start_new_session=True,
            preexec_fn=_die_with_parent if _PRCTL is not None else None,
        )
        self.started_at = time.monotonic()
        self.exited = loop.create_future()
        assert self.popen.stdout is not None
        await loop.connect_read_pipe(lambda: _LineRelay(self.name, self.last_lines, self.output), self.popen.stdout)
        self._watch_exit(loop, self.popen, self.exited)

    def _watch_exit(
        self, loop: asyncio.AbstractEventLoop, popen: subprocess.Popen[bytes], done: asyncio.Future[int]
    ) -> None:
        def finish() -> None:
            if not done.done():
                done.set_result(popen.wait())

        try:
            fd = os.pidfd_open(popen.pid)
        except (AttributeError, OSError):
            waiter = threading.Thread(target=lambda: (popen.wait(), loop.call_soon_threadsafe(finish)), daemon=True)
            waiter.start()
            return

        def readable() -> None:
            loop.remove_reader(fd)
            os.close(fd)
            finish()

        loop.add_reader(fd, readable)

    def send(self, sig: int) -> None:
        if self.popen is not None and self.popen.returncode is None:
            try:
                self.popen.send_signal(sig)
            except ProcessLookupError:
                pass

    async def stop(self, grace_s: float = 10.0) -> int | None:
        """SIGTERM (the worker drains), then SIGKILL after `grace_s`; the exit status."""
        if self.exited is None:
            return None
        if not self.exited.done():
            self.send(signal.SIGCONT)  # a stopped worker cannot act on SIGTERM
            self.send(signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.shield(self.exited), grace_s)
            except TimeoutError:
                self.send(signal.SIGKILL)
                await self.exited
        return self.exited.result()

    def kill_now(self) -> None:
        self.send(signal.SIGKILL)

    def describe_exit(self, code: int) -> str:
        if code < 0:
            try:
                how = f"killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"killed by signal {-code}"
        else:
            how = f"exited with status {code}"
        last = self.last_lines[-1] if self.last_lines else ""
        return f"worker {how}" + (f": {last}" if last and code > 0 else "")
