"""The per-token steps around the int8 GEMM in one pass each: `csrc/int8_rows.cpp`.

An int8 linear (`cpu_int8.Int8Linear`) quantizes its input row by row and finishes the GEMM's
output row by row; in torch ops that is about ten passes over the activations per linear (min,
max, scale, shift, convert; rank-1 update, scale, bias), which cost about as much as the int8 GEMM
itself on MiniLM (the profile: docs/performance.md). The C++ op does each in one
pass, a row per task (`at::parallel_for`), with the same float operations in the same order as the
torch path (`-ffp-contract=off`), so answers do not depend on which one ran.

Built once per machine at load, like the attention op, into the kernel cache (`engines/cpp_ops.py`).
No compiler, a failed build or `VLLM_SRUN_INT8_KERNELS=0` keep the torch ops, said in the card.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from vllm_srun.adapters.engines.cpp_ops import CppOp

ENV = "VLLM_SRUN_INT8_KERNELS"
OP = CppOp("int8_rows.cpp", "int8 row op", ENV, ("srun_int8", "quantize_tokens"), flags=("-ffp-contract=off",))
Progress = Callable[[str], None]


def load_int8_kernels(progress: Progress, env: Mapping[str, str] = os.environ) -> str | None:
    """Build (once per machine) and load the op; None when it is loaded, else why not (one line)."""
    return OP.load(progress, env)
