"""Precision rules (R-DT): the auto table, and which requested dtypes are refused before a load.

Pure: a family's published precision and a device kind in, a dtype name (or a one-line refusal)
out. The adapters map names to torch dtypes and detect whether a CPU has native BF16.
"""

from __future__ import annotations

from vllm_srun.domain.bounds import DTYPE

DTYPES = DTYPE.choices

# R-PKG-2: the precision each family's packages are published in
PUBLISHED: dict[str, str] = {"encoder": "float32", "multimodal": "float32", "decision": "bfloat16"}

GPU_KINDS = frozenset({"cuda", "rocm"})


def device_kind(device: str) -> str:
    """`cuda:1` → `cuda`; `cpu` → `cpu`."""
    return device.split(":", 1)[0]


def device_class(device: str) -> str:
    """The class a golden reference and its tolerance belong to: `cpu` or `gpu`."""
    return "cpu" if device_kind(device) == "cpu" else "gpu"


def auto_dtype(family: str, device: str) -> str:
    """R-DT-1: the published precision, except a BF16 model on a CPU computes in FP32."""
    published = PUBLISHED.get(family, "float32")
    if device_kind(device) == "cpu" and published != "float32":
        return "float32"
    return published


def resolve_dtype(requested: str, family: str, device: str) -> str:
    """The dtype a model computes in: `auto` follows the table; any other value is taken as is."""
    if requested not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)} (got {requested!r})")
    return auto_dtype(family, device) if requested == "auto" else requested


def dtype_refusal(requested: str, device: str, engine: str) -> str | None:
    """R-ARG-2 / R-DT-2: why this dtype cannot run here (one line), or None when it can."""
    if requested not in DTYPES:
        return f"--dtype must be one of {', '.join(DTYPES)} (got {requested!r})"
    if requested == "float16" and device_kind(device) not in GPU_KINDS:
        return f"--dtype float16 runs on GPUs only (device {device}); use auto, float32 or bfloat16"
    if engine == "onnxruntime" and requested != "auto":
        return f"--dtype {requested}: the onnxruntime engine runs only dtype auto"
    return None


def needs_bf16_warning(requested: str, device: str, cpu_has_native_bf16: bool) -> bool:
    """R-DT-2: bfloat16 on a CPU without native BF16 is allowed, but warned (slow, emulated)."""
    return requested == "bfloat16" and device_kind(device) == "cpu" and not cpu_has_native_bf16
