"""N media worker processes (R-MEDIA), each decoding one job at a time (`worker.py`).

A request's job waits for a free worker, then is sent over that worker's socket; the event loop
waits in a thread, never blocking. A worker that dies while it holds a job (killed, crashed in a
native library, or over `job_timeout_s`) fails exactly that job with `MediaWorkerDied`, and a
new process takes its place before the slot takes another job. Workers are separate processes,
so decoding runs beside the event loop and the device thread on other cores.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import pickle
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from vllm_srun.adapters.contracts.media import MediaError, MediaJob, MediaWorkerDied
from vllm_srun.adapters.media.worker import media_nice

log = logging.getLogger("vllm_srun.media")
WORKER_MODULE = "vllm_srun.adapters.media.worker"
DEFAULT_DECODER = "vllm_srun.adapters.media.decoder:PillowAvDecoder"
START_TIMEOUT_S = 60.0
JOB_TIMEOUT_S = 60.0


class _Worker:
    """One process and the socket to it; used by one thread at a time."""

    def __init__(self, index: int, decoder: str, env: dict[str, str] | None) -> None:
        self.index = index
        self.decoder = decoder
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.conn: Connection | None = None
        self.starts = 0

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def spawn(self) -> None:
        ours, theirs = socket.socketpair()
        env = {**(self.env if self.env is not None else os.environ), "OMP_NUM_THREADS": "1"}
        media_nice(env)  # a bad VLLM_SRUN_MEDIA_NICE: its one line here, not a worker that never starts
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", WORKER_MODULE, str(theirs.fileno()), self.decoder],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                env=env,
            )
        finally:
            theirs.close()
        self.conn = Connection(ours.detach())
        self.starts += 1
        if not self.conn.poll(START_TIMEOUT_S) or self._recv() != b"ready":
            code = self.stop()
            raise RuntimeError(f"media worker {self.index} did not start (exit status {code})")

    def _recv(self) -> bytes:
        assert self.conn is not None
        try:
            return self.conn.recv_bytes()
        except (EOFError, OSError):
            return b""

    def stop(self) -> int | None:
        """End the process (it is killed when it does not leave at once); its exit status."""
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        try:
            return proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()

    def call(self, job: MediaJob, timeout_s: float) -> Any:
        """Run one job (blocking): its value, MediaError for bad media, MediaWorkerDied when the
        process is gone before it answered."""
        if self.proc is None or self.proc.poll() is not None:
            self.stop()
            self.spawn()
        assert self.conn is not None and self.proc is not None
        try:
            self.conn.send_bytes(pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL))
            answered = self.conn.poll(timeout_s)
        except OSError:
            answered = False
        blob = self._recv() if answered else b""
        if not blob:
            pid = self.proc.pid
            if not answered:
                self.proc.kill()
            code = self.stop()
            why = f"took over {timeout_s:g} s" if not answered else f"exited with status {code}"
            raise MediaWorkerDied(
                f"the media worker decoding it (pid {pid}) {why}; it was replaced", "exited" if answered else "timeout"
            )
        status, value = pickle.loads(blob)
        if status == "ok":
            return value
        if status == "media":
            raise MediaError(value)
        raise RuntimeError(f"media worker: {value}")


class MediaWorkerPool:
    def __init__(
        self,
        size: int,
        decoder: str = DEFAULT_DECODER,
        *,
        job_timeout_s: float = JOB_TIMEOUT_S,
        env: dict[str, str] | None = None,
        on_replaced: Callable[[str], None] | None = None,
    ) -> None:
        if size < 1:
            raise ValueError("a media worker pool has at least one worker")
        self.size = size
        self.job_timeout_s = job_timeout_s
        self._workers = [_Worker(i, decoder, env) for i in range(size)]
        self._free: asyncio.Queue[_Worker] = asyncio.Queue()
        self._threads = concurrent.futures.ThreadPoolExecutor(max_workers=size, thread_name_prefix="srun-media")
        self._lock = threading.Lock()
        self._on_replaced = on_replaced
        self._queued = False
        self.started = False
        self.replaced = 0

    def start(self) -> None:
        """Start every worker (blocking, off the event loop; idempotent)."""
        with self._lock:
            if self.started:
                return
            for worker in self._workers:
                worker.spawn()
            self.started = True

    def pids(self) -> list[int]:
        return [pid for w in self._workers if (pid := w.pid) is not None]

    async def run(self, job: MediaJob) -> Any:
        """JOB on the next free worker: its pixels. A caller that goes away does not free the worker
        early: it is free again when its job is done."""
        if not self._queued:  # the queue lives on the event loop: filled on first use
            self._queued = True
            for worker in self._workers:
                self._free.put_nowait(worker)
        worker = await self._free.get()
        loop = asyncio.get_running_loop()
        done = self._threads.submit(worker.call, job, self.job_timeout_s)
        done.add_done_callback(lambda finished: self._finished(loop, worker, finished))
        return await asyncio.wrap_future(done)

    def _finished(self, loop: asyncio.AbstractEventLoop, worker: _Worker, job: concurrent.futures.Future[Any]) -> None:
        try:  # on the worker's thread: hand the slot back on the loop
            loop.call_soon_threadsafe(self._release, worker, job, loop)
        except RuntimeError:  # the loop closed (shutting down): nobody takes another job
            pass

    def _release(self, worker: _Worker, job: concurrent.futures.Future[Any], loop: asyncio.AbstractEventLoop) -> None:
        died = None if job.cancelled() else job.exception()
        if not isinstance(died, MediaWorkerDied):
            self._free.put_nowait(worker)
            return
        self.replaced += 1
        if self._on_replaced is not None:
            self._on_replaced(died.reason)
        log.warning("media worker %d died holding a job; starting another", worker.index)
        revived = loop.run_in_executor(self._threads, self._revive, worker)
        revived.add_done_callback(lambda _: self._free.put_nowait(worker))

    @staticmethod
    def _revive(worker: _Worker) -> None:
        try:
            worker.spawn()
        except Exception:  # the next job on this slot tries again (`_Worker.call` respawns)
            log.exception("media worker %d could not be restarted", worker.index)

    def stop(self) -> None:
        for worker in self._workers:
            worker.stop()
        self._threads.shutdown(wait=False, cancel_futures=True)
        self.started = False
