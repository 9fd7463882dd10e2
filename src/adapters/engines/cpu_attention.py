"""Attention of every row of an unpadded CPU forward in one call (R-BAT-2's packed forward).

The eager ops (`models/unpadded.ForwardOps`) run one SDPA per run of equal-length rows: a merged
forward of short texts makes dozens of calls per layer, each paying torch's dispatch and the
flash kernel's set-up, and with a head size of 32 the flash kernel's blocking does little.
`csrc/varlen_attention.cpp` is one op for the whole forward: one task per (row, head), spread
over the forward's OpenMP team (`at::parallel_for`), each computed the same way whatever else the
forward holds and whichever thread runs it, so a row's answer depends on its own tokens only
(batch- and thread-count-invariant by construction; the load-time probe still decides `exact`).
Measured here (bench/cpu_attention.py, 1 thread, MiniLM's 12 heads × 32): 1.1-1.6× the per-run
SDPA on long and mixed rows, 5-8× on a forward of many short rows.

The op is compiled once per machine at load (`c++ -O3 -march=native`, torch's headers, about
15 s) into the kernel cache (`$VLLM_SRUN_KERNEL_CACHE`, else `~/.cache/vllm-srun/kernels`),
keyed by the source, torch's version and this CPU's flags, and loaded from there afterwards. A
machine without a C++ compiler, a failed build, `VLLM_SRUN_CPU_ATTENTION=0`, a dtype other than
FP32 or a head size without a kernel keep the per-run SDPA, said in one line at load.
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

from vllm_srun.adapters.models.unpadded import EAGER_OPS, ForwardOps, PackedRows

log = logging.getLogger("vllm_srun.engines.cpu_attention")
ENV = "VLLM_SRUN_CPU_ATTENTION"
CACHE_ENV = "VLLM_SRUN_KERNEL_CACHE"
SOURCE = Path(__file__).with_name("csrc") / "varlen_attention.cpp"
FLAGS = ("-O3", "-march=native", "-std=c++17", "-fPIC", "-shared", "-fno-math-errno", "-fno-trapping-math")
Progress = Callable[[str], None]

_lock = threading.Lock()
_outcome: dict[str, str | None] = {}  # library path → None (loaded) or why it could not be


def kernel_cache(env: Mapping[str, str] = os.environ) -> Path:
    if env.get(CACHE_ENV):
        return Path(env[CACHE_ENV])
    base = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "vllm-srun" / "kernels"


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return platform.processor() or platform.machine()


def library_path(cache: Path) -> Path:
    """Where the op for this source, torch and CPU is (or will be) built."""
    key = hashlib.sha256()
    for part in (SOURCE.read_bytes(), torch.__version__.encode(), " ".join(FLAGS).encode(), _cpu_flags().encode()):
        key.update(part)
    return cache / f"varlen_attention-{key.hexdigest()[:16]}.so"


def _compiler(env: Mapping[str, str]) -> str | None:
    return shutil.which(env.get("CXX", "c++"), path=env.get("PATH")) or None


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
    """Whether this process already has the op (from any cache: one copy per process)."""
    try:
        torch.ops.srun_cpu.varlen_attention  # noqa: B018 (the lookup is the check)
    except (AttributeError, RuntimeError):
        return False
    return True


def load_varlen_attention(progress: Progress, env: Mapping[str, str] = os.environ) -> str | None:
    """Build (once per machine) and load the op; None when it is loaded, else why not (one line)."""
    value = env.get(ENV, "").strip().lower()
    if value in ("0", "off", "false", "no"):
        return f"turned off ({ENV}={env[ENV]})"
    if not sys.platform.startswith("linux"):
        return f"the one-call attention op is built on Linux only (this is {sys.platform})"
    target = library_path(kernel_cache(env))
    with _lock:
        key = str(target)
        if key in _outcome:
            return _outcome[key]
        why: str | None = None
        try:
            if not target.exists():
                compiler = _compiler(env)
                if compiler is None:
                    why = f"no C++ compiler ({env.get('CXX', 'c++')} not found)"
                else:
                    progress(f"load: building the one-call CPU attention op (once per machine) into {target.parent}")
                    _build(target, compiler)
            if why is None and not _registered():  # a second copy of the op would abort the process
                torch.ops.load_library(str(target))
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            why = f"could not build or load the attention op: {exc}"[:240]
            log.warning("one-call CPU attention unavailable", exc_info=True)
        _outcome[key] = why
        return why


class VarlenOps(ForwardOps):
    """The eager ops with attention in one call for all rows (FP32, head sizes the op has)."""

    name = "cpu_varlen"

    def __init__(self) -> None:
        self._dims: dict[int, bool] = {}

    def supports(self, head_dim: int) -> bool:
        if head_dim not in self._dims:
            self._dims[head_dim] = bool(torch.ops.srun_cpu.supports_head_dim(head_dim))
        return self._dims[head_dim]

    def attention(self, qkv: torch.Tensor, packed: PackedRows, heads: int) -> torch.Tensor:
        dim = qkv.shape[1] // (3 * heads)
        if qkv.dtype != torch.float32 or qkv.device.type != "cpu" or not self.supports(dim):
            return super().attention(qkv, packed, heads)
        return torch.ops.srun_cpu.varlen_attention(qkv.contiguous(), packed.starts, packed.lengths, heads, dim**-0.5)


def cpu_ops(dtype: torch.dtype, progress: Progress, env: Mapping[str, str] = os.environ) -> tuple[ForwardOps, str]:
    """The ops a CPU forward in DTYPE runs on, and what the card says of its attention."""
    if dtype != torch.float32:
        return EAGER_OPS, f"sdpa per run of equal-length rows (the one-call op is FP32; this model is {dtype})"
    why = load_varlen_attention(progress, env)
    if why is not None:
        progress(f"load: attention per run of equal-length rows ({why})")
        return EAGER_OPS, f"sdpa per run of equal-length rows ({why})"
    return VarlenOps(), "one call for every row (C++ varlen op)"
