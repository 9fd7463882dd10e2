"""`vllm-srun devices` (R-DEV-3) on fake machines: every device present with what it offers, and
`auto` the very device `serve --device auto` (its default) opens."""

from __future__ import annotations

import pytest

from tests.fakes import CPU_BUILD, CUDA2, HIP1, MAC, FakeProbe
from vllm_srun.adapters.devices.report import KERNEL_FEATURES, cpu_entry, device_report
from vllm_srun.adapters.devices.torch_devices import open_device
from vllm_srun.domain.settings.devices import GIB

BUSY, ROOMY = (2 * GIB, 80 * GIB), (60 * GIB, 80 * GIB)


def report(probe: FakeProbe) -> dict:  # type: ignore[type-arg]
    return device_report(probe, gpu_dtypes=lambda _gpu: frozenset({"float32", "float16"}), gpu_model=lambda i: f"G{i}")


@pytest.mark.parametrize(
    ("probe", "auto"),
    [
        (FakeProbe(CUDA2, {0: BUSY, 1: ROOMY}), "cuda:1"),
        (FakeProbe(CUDA2, {0: BUSY, 1: BUSY}), "cpu"),
        (FakeProbe(HIP1, {0: ROOMY}), "rocm:0"),
        (FakeProbe(CPU_BUILD), "cpu"),
        (FakeProbe(MAC), "cpu"),  # MPS serves when asked for (`--device mps`), not by auto
    ],
)
def test_auto_is_what_serve_opens(probe: FakeProbe, auto: str) -> None:
    got = report(probe)
    assert got["auto"] == auto == open_device("auto", probe).name
    assert got["why"].startswith("auto: ")
    assert auto in {device["name"] for device in got["devices"]}


def test_each_device_says_what_it_offers() -> None:
    got = report(FakeProbe(CUDA2, {0: BUSY, 1: ROOMY}))
    cpu, first, second = got["devices"]
    assert cpu["kind"] == "cpu" and "float32" in cpu["native_dtypes"] and isinstance(cpu["cpus"], (int, float))
    assert set(cpu["cpu_features"]) <= KERNEL_FEATURES
    assert first == {
        "name": "cuda:0",
        "kind": "cuda",
        "model": "G0",
        "memory_bytes": 80 * GIB,
        "memory_free_bytes": 2 * GIB,
        "native_dtypes": ["float16", "float32"],
    }
    assert second["name"] == "cuda:1" and got["build"] == CUDA2.build
    mac = report(FakeProbe(MAC, bf16_on_mps=False))
    assert mac["devices"][1] == {"name": "mps", "kind": "mps", "native_dtypes": ["float16", "float32"]}


def test_the_cpu_lists_only_the_features_kernels_choose_by() -> None:
    entry = cpu_entry(frozenset({"avx2", "avx512_bf16", "fpu", "pni", "amx_tile"}))
    assert entry["cpu_features"] == ["amx_tile", "avx2", "avx512_bf16"]
