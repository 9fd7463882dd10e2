"""The process's per-forward thread context on torch (R-CPU-2, `contracts.ThreadContext`).

Every forward of the process runs on a device thread, and each declares its intra-op thread
count there just before it runs; `declare` sets torch's count only when it differs from the one
in force. torch's count (OpenMP's `nthreads-var` of the calling thread, MKL's and oneDNN's) is
read by the kernels of that thread's next parallel region, so a forward always runs on the count
it declared, whatever the forward before it (another model, a shadow) asked for.
"""

from __future__ import annotations

import sys
import threading


class TorchThreadContext:
    """Per calling thread: a worker with concurrent forwards has several device threads, each with
    its own OpenMP count (`--concurrent-forwards`)."""

    def __init__(self) -> None:
        self._local = threading.local()

    @property
    def current(self) -> int | None:
        return getattr(self._local, "current", None)

    def declare(self, threads: int) -> None:
        """Set THREADS for this thread's next parallel regions. Where torch is not loaded yet (a
        device thread starting in a worker whose families may not use torch at all) nothing runs
        on it, so nothing is loaded here: `vllm-srun serve` has set `OMP_NUM_THREADS` to one
        forward's team before anything loads, and every forward declares its count again."""
        if threads < 1:
            raise ValueError(f"a forward runs on at least 1 thread, got {threads}")
        torch = sys.modules.get("torch")
        if torch is None:
            return
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        self._local.current = threads
