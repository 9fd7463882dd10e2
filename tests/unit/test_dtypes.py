"""R-DT: the auto table and the refusals before any load (pure domain rules)."""

from __future__ import annotations

import pytest

from vllm_srun.domain.settings.dtypes import auto_dtype, device_class, dtype_refusal, needs_bf16_warning, resolve_dtype


@pytest.mark.parametrize(
    ("family", "device", "want"),
    [
        ("decision", "cuda:0", "bfloat16"),
        ("decision", "rocm:1", "bfloat16"),
        ("decision", "cpu", "float32"),
        ("encoder", "cuda:0", "float32"),
        ("encoder", "cpu", "float32"),
        ("multimodal", "cuda", "float32"),
        ("multimodal", "cpu", "float32"),
    ],
)
def test_auto_table(family: str, device: str, want: str) -> None:
    assert auto_dtype(family, device) == want
    assert resolve_dtype("auto", family, device) == want


def test_any_other_value_is_taken_as_is() -> None:
    assert resolve_dtype("bfloat16", "encoder", "cpu") == "bfloat16"
    assert resolve_dtype("float32", "decision", "cuda:0") == "float32"
    with pytest.raises(ValueError):
        resolve_dtype("int8", "encoder", "cpu")


@pytest.mark.parametrize(
    ("dtype", "device", "refused"),
    [
        ("float16", "cpu", "GPUs only"),
        ("float16", "mps", None),  # Apple's GPU computes float16
        ("float16", "cuda:0", None),
        ("bfloat16", "cpu", None),
        ("float32", "cpu", None),  # what an engine refuses is its plugin's to say (test_engine_names.py)
        ("auto", "cpu", None),
    ],
)
def test_refusals(dtype: str, device: str, refused: str | None) -> None:
    why = dtype_refusal(dtype, device)
    if refused is None:
        assert why is None
    else:
        assert why is not None and refused in why and "\n" not in why


@pytest.mark.parametrize(
    ("dtype", "device", "native", "refused"),
    [
        ("bfloat16", "mps", {"float32", "float16"}, "device mps has no bfloat16 kernels (it runs float16, float32)"),
        ("bfloat16", "mps", {"float32", "float16", "bfloat16"}, None),
        ("bfloat16", "cuda:0", {"float32", "float16"}, "device cuda:0 has no bfloat16 kernels"),  # pre-Ampere
        ("float16", "cuda:0", {"float32", "float16"}, None),
        ("bfloat16", "cpu", {"float32"}, None),  # a CPU emulates BF16 (warned)
        ("float16", "cpu", {"float32", "bfloat16"}, "GPUs only"),
        ("auto", "mps", {"float32"}, None),
    ],
)
def test_refusals_against_the_devices_native_dtypes(
    dtype: str, device: str, native: set[str], refused: str | None
) -> None:
    why = dtype_refusal(dtype, device, frozenset(native))
    assert why is None if refused is None else (why is not None and refused in why and "\n" not in why)


def test_auto_falls_back_to_float32_where_the_published_precision_is_not_native() -> None:
    assert auto_dtype("decision", "cuda:0", frozenset({"float32", "float16", "bfloat16"})) == "bfloat16"
    assert auto_dtype("decision", "cuda:0", frozenset({"float32", "float16"})) == "float32"  # e.g. a V100
    assert auto_dtype("decision", "cpu", frozenset({"float32", "bfloat16"})) == "float32"  # R-DT-1 on a CPU
    assert resolve_dtype("auto", "encoder", "mps", frozenset({"float32"})) == "float32"


def test_bf16_warning_only_on_a_cpu_without_native_bf16() -> None:
    assert needs_bf16_warning("bfloat16", "cpu", cpu_has_native_bf16=False)
    assert not needs_bf16_warning("bfloat16", "cpu", cpu_has_native_bf16=True)
    assert not needs_bf16_warning("bfloat16", "cuda:0", cpu_has_native_bf16=False)
    assert not needs_bf16_warning("float32", "cpu", cpu_has_native_bf16=False)
    assert device_class("cuda:3") == "gpu" and device_class("cpu") == "cpu"
