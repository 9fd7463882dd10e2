"""`vllm-srun devices`: each device this process can drive, what it offers, and the one
`--device auto` takes (R-DEV-3, R-DEV-4) — the same choice `serve` makes (`torch_devices.auto_choice`).

```json
{"auto": "cpu", "why": "…", "build": "torch 2.13.0+cpu",
 "devices": [{"name": "cpu", "kind": "cpu", "model": "AMD EPYC …", "cpus": 2, "memory_bytes": …,
              "native_dtypes": ["float32", "bfloat16"], "cpu_features": ["avx2", "avx512_bf16", …]}]}
```

A GPU lists its model, its total and free memory and the dtypes it computes natively; the CPU its
model, CPU budget (affinity and cgroup quota), memory and the instruction-set features our kernels
look for. Without a GPU driver's device node, torch is not even imported (as `auto` itself).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vllm_srun.adapters.contracts import Device
from vllm_srun.adapters.devices.cpu_features import cpu_flags
from vllm_srun.adapters.devices.torch_devices import (
    CpuDevice,
    CudaDevice,
    DeviceProbe,
    MpsDevice,
    RocmDevice,
    TorchProbe,
    auto_choice,
)

# the CPU features the engines' kernels choose by (oneDNN, the int8 and attention ops, BF16)
KERNEL_FEATURES = frozenset(
    {
        "sse4_2",
        "avx",
        "avx2",
        "fma",
        "f16c",
        "avx512f",
        "avx512bw",
        "avx512vl",
        "avx512_vnni",
        "avx512_bf16",
        "avx512_fp16",
        "avx_vnni",
        "amx_tile",
        "amx_bf16",
        "amx_int8",
        "asimd",
        "asimddp",
        "bf16",
        "i8mm",
        "sve",
        "sve2",
    }
)

DtypesOf = Callable[[Device], frozenset[str]]


def _native_dtypes(device: Device) -> frozenset[str]:
    return device.native_dtypes


def cpu_entry(flags: frozenset[str] | None = None, cpus: float | None = None) -> dict[str, Any]:
    """The CPU as the report lists it; CPUS: its budget (affinity and cgroup quota; None: the
    CPUs of the process's affinity)."""
    device = CpuDevice()
    budget = float(len(os.sched_getaffinity(0)) if cpus is None else cpus)
    return {
        "name": device.name,
        "kind": device.kind,
        "model": _cpu_model(),
        "cpus": int(budget) if budget.is_integer() else budget,
        "memory_bytes": _host_memory(),
        "native_dtypes": sorted(device.native_dtypes),
        "cpu_features": sorted((cpu_flags() if flags is None else flags) & KERNEL_FEATURES),
    }


def device_report(
    probe: DeviceProbe | None = None,
    *,
    cpus: float | None = None,
    gpu_dtypes: DtypesOf = _native_dtypes,
    gpu_model: Callable[[int], str | None] | None = None,
) -> dict[str, Any]:
    """`vllm-srun devices`' answer (module doc). PROBE: what torch says the machine has (tests: a
    fake); CPUS: the CPU budget; GPU_DTYPES and GPU_MODEL: a GPU's native dtypes and its model
    name (tests: without torch)."""
    gpu_model = gpu_model or _gpu_model
    probe = probe or TorchProbe()
    devices = [cpu_entry(cpus=cpus)]
    build = None
    if probe.may_have_gpu():
        inventory = probe.inventory()
        build = inventory.build or None
        if inventory.gpu_platform is not None:
            for index in range(inventory.gpu_count):
                memory = probe.gpu_memory(index)
                gpu: Device = RocmDevice(index) if inventory.gpu_platform == "rocm" else CudaDevice(index)
                devices.append(
                    {
                        "name": gpu.name,
                        "kind": gpu.kind,
                        "model": gpu_model(index),
                        "memory_bytes": memory.total,
                        "memory_free_bytes": memory.free,
                        "native_dtypes": sorted(gpu_dtypes(gpu)),
                    }
                )
        if inventory.mps:
            mps = MpsDevice(bfloat16=probe.mps_bf16())
            devices.append({"name": mps.name, "kind": mps.kind, "native_dtypes": sorted(mps.native_dtypes)})
    choice = auto_choice(probe)
    return {"auto": choice.name, "why": choice.reason, "build": build, "devices": devices}


def _cpu_model() -> str | None:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("model name", "hardware", "cpu model"):
            return value.strip() or None
    return None


def _host_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _gpu_model(index: int) -> str | None:
    try:
        import torch

        return str(torch.cuda.get_device_name(index))
    except Exception:  # a fake machine in tests, or a driver that does not answer: no model name
        return None
