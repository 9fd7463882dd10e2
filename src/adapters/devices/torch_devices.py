"""Device adapters behind the `Device` contract (`adapters/contracts.py`): the CPU, and GPUs
through torch (CUDA, ROCm through torch's HIP build, MPS).

`open_device(name)` turns a `--device` value into a Device; `auto` is the CPU here (GPU
placement by free memory is the GPU engines' work). Only GPU devices import torch, and only
when asked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from vllm_srun.adapters.devices.cpu_features import cpu_has_native_bf16

DEVICE_NAME = re.compile(r"(cpu|auto|mps|cuda|rocm)(?::(\d+))?")


class DeviceUnavailable(ValueError):
    """The asked device does not exist on this machine (one line)."""


@dataclass(frozen=True)
class CpuDevice:
    kind: str = "cpu"
    index: int | None = None

    @property
    def name(self) -> str:
        return "cpu"

    @property
    def torch_device(self) -> str:
        return "cpu"

    @property
    def native_dtypes(self) -> frozenset[str]:
        return frozenset({"float32", "bfloat16"}) if cpu_has_native_bf16() else frozenset({"float32"})

    def memory_total(self) -> int | None:
        return None  # R-DEV-1: a CPU gets the CPU row of the memory-class table

    def memory_free(self) -> int | None:
        return None

    def synchronize(self) -> None:
        return None


@dataclass(frozen=True)
class TorchGpuDevice:
    """A CUDA or ROCm GPU (torch's HIP build reports ROCm GPUs as `cuda`)."""

    kind: str  # cuda | rocm
    index: int | None = 0

    @property
    def name(self) -> str:
        return f"{self.kind}:{self.index or 0}"

    @property
    def torch_device(self) -> str:
        return f"cuda:{self.index or 0}"

    @property
    def native_dtypes(self) -> frozenset[str]:
        import torch

        dtypes = {"float32", "float16"}
        if torch.cuda.is_bf16_supported():
            dtypes.add("bfloat16")
        return frozenset(dtypes)

    def memory_total(self) -> int | None:
        import torch

        return int(torch.cuda.get_device_properties(self.index or 0).total_memory)

    def memory_free(self) -> int | None:
        import torch

        free, _total = torch.cuda.mem_get_info(self.index or 0)
        return int(free)

    def synchronize(self) -> None:
        import torch

        torch.cuda.synchronize(self.index or 0)


@dataclass(frozen=True)
class MpsDevice:
    kind: str = "mps"
    index: int | None = None

    @property
    def name(self) -> str:
        return "mps"

    @property
    def torch_device(self) -> str:
        return "mps"

    @property
    def native_dtypes(self) -> frozenset[str]:
        return frozenset({"float32", "float16"})

    def memory_total(self) -> int | None:
        return None  # unified memory: MPS reports no device memory of its own

    def memory_free(self) -> int | None:
        return None

    def synchronize(self) -> None:
        import torch

        torch.mps.synchronize()


def open_device(name: str) -> CpuDevice | TorchGpuDevice | MpsDevice:
    """The Device a `--device` value names; raises DeviceUnavailable when it is not here."""
    match = DEVICE_NAME.fullmatch(name)
    if match is None:
        raise DeviceUnavailable(f"--device {name}: expected cpu, cuda:N, rocm:N, mps or auto")
    kind, index = match.group(1), match.group(2)
    if kind in ("cpu", "auto"):
        return CpuDevice()
    import torch

    if kind == "mps":
        if not torch.backends.mps.is_available():
            raise DeviceUnavailable("--device mps: MPS is not available on this machine")
        return MpsDevice()
    if not torch.cuda.is_available():
        raise DeviceUnavailable(f"--device {name}: no GPU is visible to this process")
    gpu = int(index or 0)
    if gpu >= torch.cuda.device_count():
        raise DeviceUnavailable(f"--device {name}: this process sees {torch.cuda.device_count()} GPU(s)")
    return TorchGpuDevice(kind, gpu)


def detect_gpus() -> tuple[str, list[int]]:
    """(platform, usable GPU ids) for placing new GPU workers (R-REP-1): ("cuda"|"rocm", [0, 1, …])
    or ("cpu", []). Imports torch only when asked, so a CPU front never pays for it."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return "cpu", []
    if not torch.cuda.is_available():
        return "cpu", []
    platform = "rocm" if torch.version.hip else "cuda"
    return platform, list(range(torch.cuda.device_count()))
