"""Compile the fused Triton kernels (`src/adapters/engines/triton_kernels.py`) ahead of time for
GPU targets, without a GPU: Triton lowers each kernel to PTX and a cubin (NVIDIA, with the ptxas
its wheel bundles) or to an hsaco (AMD), at the dtypes the engines launch it with (encoders FP32,
decision models BF16; R-DT-3). Prints one line per kernel and target; exits 1 if any fails.

    TRITON_INTERPRET=0 python tools/compile_triton_kernels.py [cuda:80 cuda:90 hip:gfx942 ...]

Run it in a process of its own: Triton's interpreter leaves `triton.language` patched after it ran
a kernel, so a process that interpreted kernels cannot compile them (`tests/unit/test_triton_kernels.py`
runs this script in a subprocess).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

DEFAULT_TARGETS = ("cuda:80", "cuda:90", "hip:gfx942")
POINTERS = {
    "_bias_act": ("X", "B", "Y"),
    "_add_layer_norm": ("X", "R", "W", "B", "Y"),
    "_add_rms_norm": ("X", "D", "W", "S", "Y"),
    "_silu_mul": ("G", "U", "Y"),
    "_varlen_attention": ("QKV", "OUT"),
}
SCALARS: dict[str, dict[str, str]] = {
    "_bias_act": {"n_cols": "i32", "stride_x": "i32", "stride_y": "i32"},
    "_add_layer_norm": {"n_cols": "i32", "stride": "i32", "eps": "fp32"},
    "_add_rms_norm": {"n_cols": "i32", "stride": "i32", "eps": "fp32"},
    "_silu_mul": {"n": "i32"},
    "_varlen_attention": {"STARTS": "*i32", "scale": "fp32", "stride_qkv": "i32", "stride_o": "i32"},
}
CONSTANTS: dict[str, dict[str, Any]] = {
    "_bias_act": {"ACT": 0, "BLOCK": 512},
    "_add_layer_norm": {"BLOCK": 512},
    "_add_rms_norm": {"BLOCK": 1024},
    "_silu_mul": {"BLOCK": 1024},
    "_varlen_attention": {"HEADS": 12, "HEAD_DIM": 64, "BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_D": 64},
}
# (kernel, pointer dtype, constants that differ): what the engines launch
LAUNCHED: list[tuple[str, str, dict[str, Any]]] = [
    ("_bias_act", "fp32", {"ACT": 0}),
    ("_bias_act", "fp32", {"ACT": 1}),
    ("_add_layer_norm", "fp32", {}),
    ("_varlen_attention", "fp32", {"IEEE": True, "BLOCK_M": 32, "BLOCK_N": 32}),
    ("_varlen_attention", "bf16", {"IEEE": False}),
    ("_add_rms_norm", "bf16", {}),
    ("_silu_mul", "bf16", {}),
]


def compile_all(targets: list[str]) -> list[str]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from vllm_srun.adapters.engines import triton_kernels

    failures = []
    for spec in targets:
        backend, _, arch = spec.partition(":")
        target = GPUTarget(backend, int(arch) if arch.isdigit() else arch, 32 if backend == "cuda" else 64)
        binary = "cubin" if backend == "cuda" else "hsaco"
        for kernel, dtype, extra in LAUNCHED:
            constants = CONSTANTS[kernel] | extra
            signature = dict.fromkeys(POINTERS[kernel], f"*{dtype}") | SCALARS[kernel]
            signature |= dict.fromkeys(constants, "constexpr")
            started = time.perf_counter()
            what = f"{spec:11} {kernel:18} {dtype} {extra or ''}"
            try:
                source = ASTSource(fn=getattr(triton_kernels, kernel), signature=signature, constexprs=constants)
                size = len(triton.compile(source, target=target).asm[binary])
            except Exception as exc:
                failures.append(what)
                print(f"FAIL {what}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                continue
            print(f"ok   {what}: {binary} {size} bytes in {time.perf_counter() - started:.2f} s", flush=True)
    return failures


def main(argv: list[str]) -> int:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("compile_triton_kernels: run with TRITON_INTERPRET=0 (the interpreter cannot compile)", file=sys.stderr)
        return 2
    failures = compile_all(argv or list(DEFAULT_TARGETS))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
