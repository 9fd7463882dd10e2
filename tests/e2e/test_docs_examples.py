"""Every example in docs/ runs against a real server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"


def test_openai_example(minilm_server: str) -> None:
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "embeddings_openai.py"), minilm_server],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("384 dimensions, cosine 0.7")


def test_meta_example(minilm_server: str) -> None:
    out = subprocess.run(
        ["bash", str(EXAMPLES / "embeddings_meta.sh"), minilm_server], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert "server-timing: parse;dur=" in out.stdout.lower()
    assert '"meta":{' in out.stdout and '"padded_tokens"' in out.stdout
    assert '"model_id":"all-MiniLM-L6-v2"' in out.stdout and "tokenize;dur=" in out.stdout.lower()
