"""Precision rules (R-DT): the auto table, and which requested dtypes are refused before a load.

Pure: a family's published precision and a device kind in, a dtype name (or a one-line refusal)
out. The adapters map names to torch dtypes and detect whether a CPU has native BF16.
"""

from __future__ import annotations

from vllm_srun.domain.settings.bounds import DTYPE

DTYPES = DTYPE.choices

# R-PKG-2: the precision each family's packages are published in
PUBLISHED: dict[str, str] = {"encoder": "float32", "multimodal": "float32", "audio": "float32", "decision": "bfloat16"}

GPU_KINDS = frozenset({"cuda", "rocm"})
# devices with half-precision kernels of their own (MPS is Apple's GPU)
HALF_KINDS = GPU_KINDS | {"mps"}


def device_kind(device: str) -> str:
    """`cuda:1` → `cuda`; `cpu` → `cpu`."""
    return device.split(":", 1)[0]


def device_class(device: str) -> str:
    """The class a golden reference and its tolerance belong to: `cpu` or `gpu`."""
    return "cpu" if device_kind(device) == "cpu" else "gpu"


def auto_dtype(family: str, device: str, native: frozenset[str] | None = None) -> str:
    """R-DT-1: the published precision, except a BF16 model on a CPU computes in FP32 (and so
    on a device whose NATIVE dtypes, when known, lack the published one, e.g. a pre-Ampere GPU)."""
    published = PUBLISHED.get(family, "float32")
    if device_kind(device) == "cpu" and published != "float32":
        return "float32"
    if native is not None and published not in native:
        return "float32"
    return published


def resolve_dtype(requested: str, family: str, device: str, native: frozenset[str] | None = None) -> str:
    """The dtype a model computes in: `auto` follows the table; any other value is taken as is."""
    if requested not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)} (got {requested!r})")
    return auto_dtype(family, device, native) if requested == "auto" else requested


def dtype_refusal(requested: str, device: str, native: frozenset[str] | None = None) -> str | None:
    """R-ARG-2 / R-DT-2: why this dtype cannot run here (one line), or None when it can.

    DEVICE is the device's name; NATIVE its native dtypes once the device is open (then a GPU or
    MPS device without kernels for the asked half precision is refused too). A CPU may run
    bfloat16 without native kernels (emulated, warned: `needs_bf16_warning`). The dtypes an
    engine refuses are its plugin's to say (`EngineRegistry.settings_refusal`)."""
    if requested not in DTYPES:
        return f"--dtype must be one of {', '.join(DTYPES)} (got {requested!r})"
    kind = device_kind(device)
    if requested == "float16" and kind not in HALF_KINDS:
        return f"--dtype float16 runs on GPUs only (device {device}); use auto, float32 or bfloat16"
    if native is not None and kind != "cpu" and requested in ("float16", "bfloat16") and requested not in native:
        runs = ", ".join(sorted(native))
        return f"--dtype {requested}: device {device} has no {requested} kernels (it runs {runs}); use auto or float32"
    return None


# bytes one weight takes at each precision a model may compute in
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
GIB = 1 << 30


def resident_bytes(parameters: int, dtype: str) -> int:
    """The estimated bytes a model's weights hold once loaded: PARAMETERS at DTYPE (the copies an
    engine may add, e.g. packed linears, not counted)."""
    return parameters * DTYPE_BYTES.get(dtype, 4)


def memory_refusal(parameters: int | None, dtype: str, budget_gib: float | None) -> str | None:
    """Why a model's estimated resident size exceeds BUDGET_GIB (one line naming both figures),
    or None (no budget, or no weight count known)."""
    if budget_gib is None or parameters is None:
        return None
    size = resident_bytes(parameters, dtype)
    if size <= budget_gib * GIB:
        return None
    return (
        f"the model's estimated resident size is {size / GIB:.3g} GiB ({parameters} weights at {dtype}), "
        f"over its memory budget of {budget_gib:g} GiB (memory_budget_gib)"
    )


def needs_bf16_warning(requested: str, device: str, cpu_has_native_bf16: bool) -> bool:
    """R-DT-2: bfloat16 on a CPU without native BF16 is allowed, but warned (slow, emulated)."""
    return requested == "bfloat16" and device_kind(device) == "cpu" and not cpu_has_native_bf16
