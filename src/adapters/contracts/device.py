"""Where forwards run: the `Device`, and the process's per-forward thread context."""

from __future__ import annotations

from typing import Protocol

__all__ = ["Device", "ThreadContext"]


class Device(Protocol):
    """Where a model's weights live and its forwards run."""

    @property
    def kind(self) -> str:
        """`cpu`, `cuda`, `rocm`, `mps`, or a plugin's kind."""
        ...

    @property
    def index(self) -> int | None:
        """The device's index within its kind (`cuda:1` → 1); None for the CPU and MPS."""
        ...

    @property
    def name(self) -> str:
        """As asked for and shown in the card: `cpu`, `cuda:0`, `rocm:1`, `mps`."""
        ...

    @property
    def torch_device(self) -> str:
        """What torch calls it (`rocm:1` is `cuda:1` to torch's HIP build)."""
        ...

    @property
    def native_dtypes(self) -> frozenset[str]:
        """Dtypes it computes in natively (float32 always; bfloat16/float16 where it has kernels)."""
        ...

    def memory_total(self) -> int | None:
        """Bytes of device memory; None when the device reports none (CPU, MPS, plugin devices)."""
        ...

    def memory_free(self) -> int | None:
        """Bytes free now; None when the device reports none."""
        ...

    def synchronize(self) -> None:
        """Wait until queued work finished (timings on asynchronous devices)."""
        ...

    def reset_peak_memory(self) -> None:
        """Start measuring the peak of device memory allocated from now (calibration, R-DEV-2)."""
        ...

    def peak_memory(self) -> int | None:
        """Bytes allocated at the peak since `reset_peak_memory`, beyond what was allocated then;
        None when the device reports none."""
        ...


class ThreadContext(Protocol):
    """The process's per-forward thread context (R-CPU-2): every forward declares the intra-op
    thread count it runs on, on the device thread, just before it runs; nothing else in the
    process sets a count, so models never inherit each other's."""

    @property
    def current(self) -> int | None:
        """The count the last forward declared (None before any)."""
        ...

    def declare(self, threads: int) -> None: ...
