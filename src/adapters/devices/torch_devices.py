"""Device adapters behind the `Device` contract (`adapters/contracts/device.py`): the CPU, CUDA and ROCm
GPUs through torch (torch's HIP build calls ROCm GPUs `cuda`), and Apple's MPS.

`open_device(name)` turns a `--device` value into a Device, or refuses it with one line before
any weights load (`domain/settings/devices.py` decides: a device that does not exist, a GPU index out of
range, `rocm` on a CUDA build, MPS where there is none). `auto` is the first GPU with room, else
the CPU. What torch knows about the machine reaches the rules through a `DeviceProbe`
(`TorchProbe` here, fakes in tests); only GPU and MPS devices import torch, and only when asked.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Protocol

from vllm_srun.adapters.contracts import Device, Progress, quiet
from vllm_srun.adapters.devices.cpu_features import cpu_has_native_bf16
from vllm_srun.domain.settings.devices import (
    DeviceChoice,
    DeviceInventory,
    DeviceRefused,
    GpuMemory,
    parse_device,
    resolve_device,
)

DeviceUnavailable = DeviceRefused  # the name callers used before the rules moved to the domain


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

    def reset_peak_memory(self) -> None:
        return None

    def peak_memory(self) -> int | None:
        return None


@dataclass
class TorchGpuDevice:
    """A GPU driven through torch's `cuda` API (CUDA, or ROCm on torch's HIP build)."""

    kind: str  # cuda | rocm
    index: int | None = 0
    _base: int = field(default=0, repr=False, compare=False)  # bytes allocated at the last peak reset

    @property
    def gpu(self) -> int:
        return self.index or 0

    @property
    def name(self) -> str:
        return f"{self.kind}:{self.gpu}"

    @property
    def torch_device(self) -> str:
        return f"cuda:{self.gpu}"

    @property
    def native_dtypes(self) -> frozenset[str]:
        import torch

        dtypes = {"float32", "float16"}
        if self.kind == "rocm" or torch.version.hip:
            if torch.cuda.is_bf16_supported():
                dtypes.add("bfloat16")
        elif torch.cuda.get_device_capability(self.gpu) >= (8, 0):  # Ampere and later compute BF16
            dtypes.add("bfloat16")
        return frozenset(dtypes)

    def memory_total(self) -> int | None:
        import torch

        return int(torch.cuda.get_device_properties(self.gpu).total_memory)

    def memory_free(self) -> int | None:
        """Free for this process: what the driver reports free, plus what torch's caching
        allocator holds but does not use."""
        import torch

        free, _total = torch.cuda.mem_get_info(self.gpu)
        cached = torch.cuda.memory_reserved(self.gpu) - torch.cuda.memory_allocated(self.gpu)
        return int(free + max(cached, 0))

    def synchronize(self) -> None:
        import torch

        torch.cuda.synchronize(self.gpu)

    def reset_peak_memory(self) -> None:
        import torch

        torch.cuda.reset_peak_memory_stats(self.gpu)
        self._base = int(torch.cuda.memory_allocated(self.gpu))

    def peak_memory(self) -> int | None:
        import torch

        return max(0, int(torch.cuda.max_memory_allocated(self.gpu)) - self._base)


class CudaDevice(TorchGpuDevice):
    def __init__(self, index: int = 0) -> None:
        super().__init__("cuda", index)


class RocmDevice(TorchGpuDevice):
    """A ROCm GPU: named `rocm:N`, which torch's HIP build calls `cuda:N`."""

    def __init__(self, index: int = 0) -> None:
        super().__init__("rocm", index)


@dataclass(frozen=True)
class MpsDevice:
    kind: str = "mps"
    index: int | None = None
    bfloat16: bool = False  # MPS computes BF16 from macOS 14 on (`TorchProbe.mps_bf16`)

    @property
    def name(self) -> str:
        return "mps"

    @property
    def torch_device(self) -> str:
        return "mps"

    @property
    def native_dtypes(self) -> frozenset[str]:
        return frozenset({"float32", "float16", "bfloat16"} if self.bfloat16 else {"float32", "float16"})

    def memory_total(self) -> int | None:
        return None  # unified memory: MPS reports no device memory of its own

    def memory_free(self) -> int | None:
        return None

    def synchronize(self) -> None:
        import torch

        torch.mps.synchronize()

    def reset_peak_memory(self) -> None:
        return None

    def peak_memory(self) -> int | None:
        return None


class DeviceProbe(Protocol):
    """What the machine offers, as the device rules need it."""

    def may_have_gpu(self) -> bool:
        """False when no GPU can be here (no driver's device node): `auto` then asks nothing more."""
        ...

    def inventory(self) -> DeviceInventory: ...

    def gpu_memory(self, index: int) -> GpuMemory: ...

    def mps_bf16(self) -> bool: ...


# device nodes without which no GPU driver can be reached: NVIDIA, AMD (ROCm), NVIDIA under WSL2
GPU_DEVICE_NODES = ("/dev/nvidiactl", "/dev/kfd", "/dev/dxg")


def gpu_possible() -> bool:
    """Whether this host could have a GPU torch drives: a GPU driver's device node, or a Mac (MPS).
    When it cannot, `--device auto` is the CPU without importing torch (a torch-free family stays so)."""
    return sys.platform == "darwin" or any(os.path.exists(node) for node in GPU_DEVICE_NODES)


class TorchProbe:
    """Asks torch (imported on first use)."""

    def may_have_gpu(self) -> bool:
        return gpu_possible()

    def inventory(self) -> DeviceInventory:
        import torch

        platform = "rocm" if torch.version.hip else "cuda" if torch.version.cuda else None
        build = f"torch {torch.__version__}" + (
            f", HIP {torch.version.hip}"
            if torch.version.hip
            else f", CUDA {torch.version.cuda}"
            if torch.version.cuda
            else ""
        )
        count = torch.cuda.device_count() if platform is not None and torch.cuda.is_available() else 0
        return DeviceInventory(platform, count, bool(torch.backends.mps.is_available()), build)

    def gpu_memory(self, index: int) -> GpuMemory:
        import torch

        free, total = torch.cuda.mem_get_info(index)
        return GpuMemory(index, int(total), int(free))

    def mps_bf16(self) -> bool:
        import torch

        try:
            torch.ones(1, dtype=torch.bfloat16, device="mps")
        except (RuntimeError, TypeError):
            return False
        return True


def device_for(choice: DeviceChoice, probe: DeviceProbe) -> Device:
    if choice.kind == "cpu":
        return CpuDevice()
    if choice.kind == "mps":
        return MpsDevice(bfloat16=probe.mps_bf16())
    assert choice.index is not None
    return RocmDevice(choice.index) if choice.kind == "rocm" else CudaDevice(choice.index)


NO_GPU_NODE = f"auto: no GPU device node here ({', '.join(GPU_DEVICE_NODES)}); the CPU"


def auto_choice(probe: DeviceProbe) -> DeviceChoice:
    """What `--device auto` (the default, R-DEV-4) takes on this machine (`serve` and `vllm-srun devices` alike): the
    first GPU with room, else the CPU (`domain/settings/devices.pick_auto`); torch is not even asked where
    no GPU driver's device node is."""
    if not probe.may_have_gpu():
        return DeviceChoice("cpu", None, NO_GPU_NODE)
    inventory = probe.inventory()
    gpus: list[GpuMemory] = []
    if inventory.gpu_platform is not None:
        gpus = [probe.gpu_memory(i) for i in range(inventory.gpu_count)]
    return resolve_device("auto", inventory, gpus)


def open_device(name: str, probe: DeviceProbe | None = None, progress: Progress = quiet) -> Device:
    """The Device a `--device` value names; DeviceRefused (a ValueError, one line) when it is not here.
    `auto` (the default) says which device it took and why, except on a host where no GPU can be
    (no driver's device node): there it is the CPU without a word, as `--device cpu`."""
    kind, _index = parse_device(name)
    if kind == "cpu":
        return CpuDevice()  # no torch import for the CPU
    probe = probe or TorchProbe()
    if kind == "auto":
        choice = auto_choice(probe)
        if choice.reason and choice.reason != NO_GPU_NODE:
            progress(f"device: {choice.reason}")
        return device_for(choice, probe)
    choice = resolve_device(name, probe.inventory())
    return device_for(choice, probe)


def detect_gpus() -> tuple[str, list[int]]:
    """(platform, usable GPU ids) for placing new GPU workers (R-REP-1): ("cuda"|"rocm", [0, 1, …])
    or ("cpu", []). Imports torch only when asked, so a CPU front never pays for it."""
    try:
        inventory = TorchProbe().inventory()
    except ImportError:  # pragma: no cover - torch is a dependency
        return "cpu", []
    if inventory.gpu_platform is None or inventory.gpu_count == 0:
        return "cpu", []
    return inventory.gpu_platform, list(range(inventory.gpu_count))
