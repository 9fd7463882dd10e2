"""The README's "One example per surface" block runs as written (issue 45: a README a newcomer
reads to the end): the same commands in bash, only the port and the /tmp folders changed so the
test runs beside others; every answer is a 200 of its surface's shape."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.e2e.server import free_port
from tests.stores import subprocess_env

pytestmark = pytest.mark.slow
README = Path(__file__).resolve().parents[2] / "README.md"


def _tour() -> str:
    text = README.read_text(encoding="utf-8")
    section = text.split("## One example per surface", 1)[1]
    match = re.search(r"```bash\n(.*?)```", section, re.S)
    assert match is not None, "the README lost its example block"
    return match.group(1)


def test_the_readme_examples_run_as_written(tmp_path: Path) -> None:
    port = free_port()
    script = _tour().replace("/tmp/", f"{tmp_path}/").replace("localhost:8100", f"localhost:{port}")
    script = script.replace("vllm-srun serve ", f"vllm-srun serve --port {port} ", 1)
    # the server the block starts in the background ends with the block; curl prints one answer a line
    script = "set -e\ntrap 'kill $(jobs -p) 2>/dev/null' EXIT\n" + script.replace("curl -s ", "curl -sS -w '\\n' ")
    done = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, timeout=600, env=subprocess_env(), cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answers = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    embeddings, classify, rerank, decisions = answers[-4:]
    assert len(embeddings["data"]) == 2 and len(embeddings["data"][0]["embedding"]) == 384
    assert classify["kind"] == "sequence" and len(classify["results"]) == 2
    assert sorted(r["index"] for r in rerank["results"]) == [0, 1]
    assert set(decisions["answers"]) == {"refund", "mood"}
    assert 0 <= decisions["answers"]["refund"]["noul"] <= 1 and decisions["answers"]["mood"]["choice"] in (
        "angry",
        "calm",
    )
