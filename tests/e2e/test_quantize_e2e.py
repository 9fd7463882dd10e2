"""`vllm-srun quantize MODEL OUT --int8` end to end: a real process writes the int8 package of a
fixture, a real `vllm-srun serve OUT` answers /v1/embeddings on it (its card says `quantization`,
its golden file recorded at int8 matches), and refusals exit with one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from tests.e2e.server import running_server
from tests.stores import subprocess_env
from vllm_srun.adapters.engines.cpu_int8 import int8_unsupported
from vllm_srun.adapters.models.reference_encoder import ReferenceEncoder
from vllm_srun.adapters.models.tokenization import TextTokenizer

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        int8_unsupported("cpu", torch.float32) is not None,
        reason=f"int8 packages do not run here: {int8_unsupported('cpu', torch.float32)}",
    ),
]


def _quantize(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vllm_srun.app.cli", "quantize", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=subprocess_env(),
    )


def test_quantize_then_serve_the_int8_package(encoder_fixture, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    source = encoder_fixture("embed")
    out = tmp_path / "tiny-embed-int8"
    done = _quantize(str(source), str(out), "--int8")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(out)
    assert "quantize: read back" in done.stderr and "quantize: recording the golden answers" in done.stderr
    texts = ["the cat sat on the mat", "a quick brown fox"]
    with running_server(str(out)) as base:
        card = httpx.get(f"{base}/v1/models").json()["data"][0]
        r = httpx.post(f"{base}/v1/embeddings", json={"input": texts})
    assert card["quantization"]["method"] == "vllm-srun-int8" and card["kernels"]["linear"].startswith("int8")
    assert card["golden"]["status"] == "matched" and card["ready"]
    assert r.status_code == 200
    got = np.array([d["embedding"] for d in r.json()["data"]])
    want = ReferenceEncoder.from_folder(source).embed(TextTokenizer.from_folder(source).encode(texts))
    cosine = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cosine.min() >= 0.995  # the FP32 original's direction, within int8's error

    # refusals: one line on stderr, exit 2, nothing written
    again = _quantize(str(source), str(out), "--int8")
    missing = _quantize("--int8", str(tmp_path / "no-such-model"), str(tmp_path / "o1"))
    no_scheme = _quantize(str(source), str(tmp_path / "o2"))
    for refused, words in (
        (again, "exists and is not an empty folder"),
        (missing, "not a folder, not in the model store"),
        (no_scheme, "--int8"),
    ):
        assert refused.returncode == 2
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("vllm-srun: error: quantize:") and words in lines[0]
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()


def test_a_decision_model_is_refused_in_one_line(decision_fixture, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    done = _quantize(str(decision_fixture("llama")), str(tmp_path / "out"), "--int8")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "is a decision model: only encoder packages" in lines[0]
    assert not (tmp_path / "out").exists()
