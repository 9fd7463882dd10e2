"""Devices (R-DEV-1, R-DEV-3): what a `--device` value names, the one-line refusals before any
weights load, `--device auto` (the first GPU with room, else the CPU), and memory classes, against
fake machines (no torch, no GPU)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fakes import CPU_BUILD, CUDA2, HIP1, MAC, NO_GPU_VISIBLE, FakeProbe
from vllm_srun.adapters.devices.torch_devices import CpuDevice, CudaDevice, MpsDevice, RocmDevice, open_device
from vllm_srun.domain.settings.devices import (
    GIB,
    DeviceInventory,
    DeviceRefused,
    GpuMemory,
    class_limits,
    has_room,
    parse_device,
    pick_auto,
    resolve_device,
)


@pytest.mark.parametrize(
    ("name", "kind", "index"),
    [("cpu", "cpu", None), ("auto", "auto", None), ("mps", "mps", None), ("cuda", "cuda", 0), ("rocm:3", "rocm", 3)],
)
def test_parse(name: str, kind: str, index: int | None) -> None:
    assert parse_device(name) == (kind, index)


@pytest.mark.parametrize(
    ("name", "machine", "why"),
    [
        ("cuda:0", CPU_BUILD, "--device cuda:0: this torch build has no GPU support (torch 2.13.0+cpu)"),
        ("rocm:0", CPU_BUILD, "--device rocm:0: this torch build has no GPU support"),
        ("rocm:1", CUDA2, "this torch build drives CUDA GPUs, not ROCm (torch 2.13.0, CUDA 12.8); use --device cuda:1"),
        ("cuda:2", CUDA2, "--device cuda:2: GPU index out of range; this process sees 2 GPU(s): cuda:0, cuda:1"),
        ("rocm:1", HIP1, "--device rocm:1: GPU index out of range; this process sees 1 GPU(s): rocm:0"),
        ("cuda:0", NO_GPU_VISIBLE, "--device cuda:0: no GPU is visible to this process"),
        ("mps", CUDA2, "--device mps: MPS is not available here"),
        ("xpu:0", CUDA2, "--device xpu:0: expected cpu, cuda:N, rocm:N, mps or auto"),
        ("cpu:1", CUDA2, "--device cpu:1: cpu takes no index"),
    ],
)
def test_refusals_are_one_line(name: str, machine: DeviceInventory, why: str) -> None:
    with pytest.raises(DeviceRefused) as refused:
        resolve_device(name, machine)
    assert why in str(refused.value) and "\n" not in str(refused.value)
    with pytest.raises(ValueError, match="--device"):  # the adapter refuses the same, before any load
        open_device(name, FakeProbe(machine))


def test_what_each_name_opens() -> None:
    assert resolve_device("rocm:0", HIP1).name == "rocm:0"
    assert resolve_device("cuda:0", HIP1).name == "cuda:0"  # torch's HIP build calls ROCm GPUs cuda
    assert open_device("cpu", FakeProbe(CPU_BUILD)) == CpuDevice()
    assert open_device("cuda:1", FakeProbe(CUDA2)) == CudaDevice(1)
    rocm = open_device("rocm:0", FakeProbe(HIP1))
    assert isinstance(rocm, RocmDevice) and (rocm.name, rocm.torch_device) == ("rocm:0", "cuda:0")
    mps = open_device("mps", FakeProbe(MAC, bf16_on_mps=False))
    assert isinstance(mps, MpsDevice) and mps.native_dtypes == {"float32", "float16"}
    assert open_device("mps", FakeProbe(MAC)).native_dtypes == {"float32", "float16", "bfloat16"}


def test_auto_takes_the_first_gpu_with_room_else_the_cpu() -> None:
    said: list[str] = []
    busy, roomy = (2 * GIB, 80 * GIB), (60 * GIB, 80 * GIB)
    probe = FakeProbe(CUDA2, {0: busy, 1: roomy})
    device = open_device("auto", probe, progress=said.append)
    assert device == CudaDevice(1) and probe.asked == [0, 1]
    assert said == ["device: auto: cuda:1, 60.0 GiB of 80.0 GiB free"]
    said.clear()
    assert open_device("auto", FakeProbe(CUDA2, {0: busy, 1: busy}), progress=said.append) == CpuDevice()
    assert said[0].startswith("device: auto: no GPU with room (cuda:0 2.0 GiB free of 80.0 GiB")
    assert isinstance(open_device("auto", FakeProbe(HIP1, {0: roomy})), RocmDevice)
    cpu_probe = FakeProbe(CPU_BUILD)
    assert open_device("auto", cpu_probe) == CpuDevice() and cpu_probe.asked == []
    assert open_device("auto", FakeProbe(MAC)) == CpuDevice()  # auto means a CUDA/ROCm GPU, else the CPU


gpus = st.lists(
    st.tuples(st.integers(0, 200 * GIB), st.integers(1, 200 * GIB)).map(lambda ft: (min(ft), max(ft))),
    min_size=0,
    max_size=8,
)


@given(gpus)
def test_auto_is_the_first_gpu_with_room(memories: list[tuple[int, int]]) -> None:
    inventory = DeviceInventory("cuda", len(memories))
    found = [GpuMemory(i, total, free) for i, (free, total) in enumerate(memories)]
    choice = pick_auto(inventory, found)
    roomy = [g.index for g in found if has_room(g)]
    if roomy:
        assert (choice.kind, choice.index) == ("cuda", roomy[0])
        gpu = found[roomy[0]]
        assert gpu.free >= 0.2 * gpu.total and gpu.free >= GIB
    else:
        assert (choice.kind, choice.index) == ("cpu", None)
    assert choice.reason.startswith("auto: ")


@pytest.mark.parametrize(
    ("kind", "memory", "tokens", "seqs", "memory_class"),
    [
        ("cuda", 192 * 10**9, 32_768, 256, ">=160GB"),
        ("rocm", 256 * 10**9, 32_768, 256, ">=160GB"),
        ("cuda", 141 * 10**9, 16_384, 128, "64-160GB"),
        ("cuda", 48 * 10**9, 8_192, 64, "32-64GB"),
        ("cuda", 24 * 10**9, 4_096, 32, "<32GB"),
        ("cpu", None, 65_536, 8_192, "cpu"),
        ("mps", None, 65_536, 8_192, "unreported"),
    ],
)
def test_memory_classes(kind: str, memory: int | None, tokens: int, seqs: int, memory_class: str) -> None:
    limits = class_limits(kind, memory)
    assert (limits.max_num_batched_tokens, limits.max_num_seqs, limits.memory_class) == (tokens, seqs, memory_class)
