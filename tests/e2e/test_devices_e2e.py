"""`--device` as a user meets it on this machine (a CPU-only torch build, R-DEV-3): a device that is
not here is refused with one line and exit status 2 before anything loads; `--device auto` serves
on the first GPU with room, here the CPU, and says so."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.server import running_server
from tests.stores import subprocess_env

pytestmark = pytest.mark.slow

CLI = [sys.executable, "-m", "vllm_srun.app.cli"]


@pytest.mark.parametrize(
    ("flags", "why"),
    [
        (["--device", "cuda:0"], "--device cuda:0: this torch build has no GPU support"),
        (["--device", "rocm:1"], "--device rocm:1: this torch build has no GPU support"),
        (["--device", "mps"], "--device mps: MPS is not available here"),
        (["--device", "cuda:0", "--dtype", "float16"], "--device cuda:0: this torch build has no GPU support"),
        (["--device", "auto", "--dtype", "float16"], "--dtype float16 runs on GPUs only (device cpu)"),
        (["--device", "gpu:0"], "argument --device: expected one of cpu, auto, mps, cuda[:N], rocm[:N]"),
    ],
)
def test_a_device_that_is_not_here_is_refused_before_any_load(flags: list[str], why: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [*CLI, "serve", str(tmp_path / "not-even-read"), *flags],
        capture_output=True,
        text=True,
        timeout=120,
        env=subprocess_env(),
    )
    lines = [line for line in done.stderr.strip().splitlines() if not line.startswith("device: ")]
    assert done.returncode == 2 and len(lines) == 1 and why in lines[0], done.stderr
    assert "load:" not in done.stderr


def test_auto_serves_on_the_cpu_without_a_gpu(encoder_fixture, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with running_server(str(encoder_fixture("embed")), "--device", "auto") as base:
        card = httpx.get(f"{base}/v1/models").json()["data"][0]
        assert card["device"] == "cpu" and card["ready"] and card["engine_args"]["memory_class"] == "cpu"
        assert card["engine_args"]["calibration"] is None  # calibration runs on GPU workers only
        assert httpx.post(f"{base}/v1/embeddings", json={"input": "hello"}).status_code == 200


def test_the_gpu_check_stops_at_once_without_a_gpu() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: bench/gpu_check.py would run")
    script = Path(__file__).resolve().parents[2] / "bench" / "gpu_check.py"
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=subprocess_env()
    )
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("gpu_check: no GPU is visible"), lines
    assert time.monotonic() - started < 60
