"""The per-token steps around the int8 GEMM in one pass each: `csrc/int8_rows.cpp`.

An int8 linear (`cpu_int8.Int8Linear`) quantizes its input row by row and finishes the GEMM's
output row by row; in torch ops that is about ten passes over the activations per linear (min,
max, scale, shift, convert; rank-1 update, scale, bias), which cost about as much as the int8 GEMM
itself on MiniLM (profiled here: 36 % of a forward of short texts). The C++ op does each in one
pass, a row per task (`at::parallel_for`), with the same float operations in the same order as the
torch path (`-ffp-contract=off`), so answers do not depend on which one ran.

Built once per machine at load, like the attention op (`cpu_attention.py`): `c++ -O3 -march=native`
against torch's headers into the kernel cache (`$VLLM_SRUN_KERNEL_CACHE`, else
`~/.cache/vllm-srun/kernels`), keyed by the source, torch's version, the flags and this CPU's
flags. No compiler, a failed build or `VLLM_SRUN_INT8_KERNELS=0` keep the torch ops, said in the card.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from vllm_srun.adapters.engines.cpu_attention import kernel_cache

log = logging.getLogger("vllm_srun.engines.int8_kernels")
ENV = "VLLM_SRUN_INT8_KERNELS"
SOURCE = Path(__file__).with_name("csrc") / "int8_rows.cpp"
FLAGS = ("-O3", "-march=native", "-std=c++17", "-fPIC", "-shared", "-ffp-contract=off", "-fno-math-errno")
Progress = Callable[[str], None]

_lock = threading.Lock()
_outcome: dict[str, str | None] = {}  # library path → None (loaded) or why it could not be


def _cpu_flags() -> str:
    from vllm_srun.adapters.devices.cpu_features import cpu_flags

    return " ".join(sorted(cpu_flags())) or platform.machine()


def library_path(cache: Path) -> Path:
    """Where the op for this source, torch and CPU is (or will be) built."""
    key = hashlib.sha256()
    for part in (SOURCE.read_bytes(), torch.__version__.encode(), " ".join(FLAGS).encode(), _cpu_flags().encode()):
        key.update(part)
    return cache / f"int8_rows-{key.hexdigest()[:16]}.so"


def _build(target: Path, compiler: str) -> None:
    from torch.utils import cpp_extension

    includes = [f"-I{p}" for p in cpp_extension.include_paths()]
    libs = [f"-L{p}" for p in cpp_extension.library_paths()]
    abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".so.tmp")
    os.close(fd)
    try:
        argv = [compiler, *FLAGS, abi, *includes, str(SOURCE), "-o", tmp, *libs, "-lc10", "-ltorch_cpu"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            lines = [line for line in done.stderr.splitlines() if "error" in line] or done.stderr.splitlines()
            raise RuntimeError(f"{Path(compiler).name} failed: {(lines or ['no output'])[0][:160]}")
        os.replace(tmp, target)  # atomic: a concurrent build of the same key writes the same bytes
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _registered() -> bool:
    try:
        torch.ops.srun_int8.quantize_tokens  # noqa: B018 (the lookup is the check)
    except (AttributeError, RuntimeError):
        return False
    return True


def load_int8_kernels(progress: Progress, env: Mapping[str, str] = os.environ) -> str | None:
    """Build (once per machine) and load the op; None when it is loaded, else why not (one line)."""
    value = env.get(ENV, "").strip().lower()
    if value in ("0", "off", "false", "no"):
        return f"turned off ({ENV}={env[ENV]})"
    if not sys.platform.startswith("linux"):
        return f"the int8 row op is built on Linux only (this is {sys.platform})"
    target = library_path(kernel_cache(env))
    with _lock:
        key = str(target)
        if key in _outcome:
            return _outcome[key]
        why: str | None = None
        try:
            if not target.exists():
                compiler = shutil.which(env.get("CXX", "c++"), path=env.get("PATH"))
                if compiler is None:
                    why = f"no C++ compiler ({env.get('CXX', 'c++')} not found)"
                else:
                    progress(f"load: building the int8 row op (once per machine) into {target.parent}")
                    _build(target, compiler)
            if why is None and not _registered():  # a second copy of the op would abort the process
                torch.ops.load_library(str(target))
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            why = f"could not build or load the int8 row op: {exc}"[:240]
            log.warning("int8 row op unavailable", exc_info=True)
        _outcome[key] = why
        return why
