"""Our C++ ops (`engines/csrc/`): each built once per machine, loaded once per process.

An op is compiled at the first load that needs it (`c++ -O3 -march=native -fopenmp` against
torch's headers and libraries; its time: docs/performance.md) into the kernel cache
(`$VLLM_SRUN_KERNEL_CACHE`, else
`$XDG_CACHE_HOME/vllm-srun/kernels` or `~/.cache/vllm-srun/kernels`), under a name keyed by its
source, torch's version, the flags and this CPU's flags, written to a temporary file and renamed
(two processes building at once write the same bytes). Later loads read it from there.
`-fopenmp` is what makes the ops' `at::parallel_for` loops parallel: without it ATen's OpenMP loop
compiles to a plain call on the calling thread (every C++ loop then ran on one thread whatever the
forward's count); the library's libgomp is torch's, already loaded (one OpenMP runtime in the
process). A process loads an op once (registering it twice would abort): `CppOp.load` says None
when it is there, or why not in one line (turned off, no compiler, a failed build), and the caller
keeps its torch path.
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
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch

log = logging.getLogger("vllm_srun.engines.cpp_ops")
CACHE_ENV = "VLLM_SRUN_KERNEL_CACHE"
CSRC = Path(__file__).with_name("csrc")
BASE_FLAGS = ("-O3", "-march=native", "-std=c++17", "-fPIC", "-shared", "-fno-math-errno", "-fopenmp")
Progress = Callable[[str], None]


def kernel_cache(env: Mapping[str, str] = os.environ) -> Path:
    if env.get(CACHE_ENV):
        return Path(env[CACHE_ENV])
    base = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "vllm-srun" / "kernels"


def compiler(env: Mapping[str, str]) -> str | None:
    """The C++ compiler ($CXX, else c++) on ENV's PATH; None when there is none."""
    return shutil.which(env.get("CXX", "c++"), path=env.get("PATH")) or None


def _cpu_flags() -> str:
    from vllm_srun.adapters.devices.cpu_features import cpu_flags

    return " ".join(sorted(cpu_flags())) or platform.processor() or platform.machine()


def _off(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "").strip().lower() in ("0", "off", "false", "no")


class CppOp:
    """One op library: SOURCE in `csrc/` (and ALSO, more sources compiled into the same library;
    the headers they include are in `csrc/` too), FLAGS beyond the base ones, SWITCH (an
    environment variable whose `0` turns it off), WHAT it is called in messages, and PROBE, an op
    name whose lookup in `torch.ops` tells whether this process has it already."""

    def __init__(
        self,
        source: str,
        what: str,
        switch: str,
        probe: tuple[str, str],
        flags: Sequence[str] = (),
        also: Sequence[str] = (),
    ) -> None:
        self.source = CSRC / source
        self.sources = (self.source, *(CSRC / name for name in also))
        self.what = what
        self.switch = switch
        self.probe = probe
        self.flags = (*BASE_FLAGS, *flags)
        self._lock = threading.Lock()
        self._outcome: dict[str, str | None] = {}  # library path → None (loaded) or why not

    def library_path(self, cache: Path) -> Path:
        """Where the op for this source, torch and CPU is (or will be) built."""
        key = hashlib.sha256()
        files = (*self.sources, *sorted(CSRC.glob("*.h")))
        parts: list[bytes | str] = [f.read_bytes() for f in files]
        parts += [torch.__version__, " ".join(self.flags), _cpu_flags()]
        for part in parts:
            key.update(part if isinstance(part, bytes) else part.encode())
        return cache / f"{self.source.stem}-{key.hexdigest()[:16]}.so"

    def registered(self) -> bool:
        """Whether this process has the op already (from any cache)."""
        namespace, name = self.probe
        try:
            getattr(getattr(torch.ops, namespace), name)
        except (AttributeError, RuntimeError):
            return False
        return True

    def _build(self, target: Path, cxx: str) -> None:
        from torch.utils import cpp_extension

        includes = [f"-I{p}" for p in cpp_extension.include_paths()]
        libs = [f"-L{p}" for p in cpp_extension.library_paths()]
        abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".so.tmp")
        os.close(fd)
        try:
            sources = [str(f) for f in self.sources]
            argv = [cxx, *self.flags, abi, *includes, *sources, "-o", tmp, *libs, "-lc10", "-ltorch_cpu"]
            done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                lines = [line for line in done.stderr.splitlines() if "error" in line] or done.stderr.splitlines()
                raise RuntimeError(f"{Path(cxx).name} failed: {(lines or ['no output'])[0][:160]}")
            os.replace(tmp, target)  # atomic: a concurrent build of the same key writes the same bytes
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def load(self, progress: Progress, env: Mapping[str, str] = os.environ) -> str | None:
        """Build (once per machine) and load the op; None when it is loaded, else why not (one line)."""
        if _off(env, self.switch):
            return f"turned off ({self.switch}={env[self.switch]})"
        if not sys.platform.startswith("linux"):
            return f"the {self.what} is built on Linux only (this is {sys.platform})"
        target = self.library_path(kernel_cache(env))
        with self._lock:
            key = str(target)
            if key in self._outcome:
                return self._outcome[key]
            why: str | None = None
            try:
                if not target.exists():
                    cxx = compiler(env)
                    if cxx is None:
                        why = f"no C++ compiler ({env.get('CXX', 'c++')} not found)"
                    else:
                        progress(f"load: building the {self.what} (once per machine) into {target.parent}")
                        self._build(target, cxx)
                if why is None and not self.registered():  # a second copy of the op would abort the process
                    torch.ops.load_library(str(target))
            except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
                why = f"could not build or load the {self.what}: {exc}"[:240]
                log.warning("%s unavailable", self.what, exc_info=True)
            self._outcome[key] = why
            return why
