"""`vllm-srun batch` end to end (docs/batch.md): one input file of embeddings, classify, rerank and
decisions lines (bad lines among them) answered by a running `vllm-srun serve` one request at a
time, by `batch --url` against it, and by `batch --model` running the same models in its own
process; every answer body is the online one (ids and timings aside), bad lines are error lines,
and a rerun after a crash's torn last line redoes exactly what is missing."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.server import running_server
from tests.stores import subprocess_env

pytestmark = pytest.mark.slow
CLI = [sys.executable, "-m", "vllm_srun.app.cli"]
SERVING = ("--deterministic", "--result-cache-entries", "0", "--threads", "1")  # every answer computed, same bits
QUESTIONS = {"short": {"type": "noul", "instructions": "Is this short?"}}


def _lines() -> list[str]:
    good: list[dict] = []
    for i in range(12):
        good.append({"url": "/v1/embeddings", "body": {"model": "tiny-embed", "input": [f"text {i}", "more " * i]}})
        good.append({"url": "/v1/classify", "body": {"model": "tiny-classify", "input": f"is {i} good?"}})
    for i in range(4):
        docs = [f"doc {j} " * (i + 1) for j in range(3)]
        good.append({"url": "/v1/rerank", "body": {"model": "tiny-rerank", "query": f"q{i}", "documents": docs}})
        state = f"state {i} " * 5
        good.append(
            {"url": "/v1/decisions", "body": {"model": "tiny-decision-llama", "state": state, "questions": QUESTIONS}}
        )
    lines = [json.dumps({"custom_id": f"c{n}", "method": "POST", **line}) for n, line in enumerate(good)]
    bad = [
        "{not json",
        json.dumps({"custom_id": "c3", "method": "POST", "url": "/v1/embeddings", "body": {"input": "dup"}}),
        json.dumps({"custom_id": "u", "method": "POST", "url": "/v1/chat/completions", "body": {}}),
        json.dumps({"custom_id": "v", "method": "POST", "url": "/v1/embeddings", "body": {"inputs": "x"}}),
        json.dumps(
            {"custom_id": "m", "method": "POST", "url": "/v1/embeddings", "body": {"model": "nope", "input": "x"}}
        ),
    ]
    for at, line in zip((5, 9, 17, 30, 40), bad, strict=True):
        lines.insert(at, line)
    return lines


@pytest.fixture(scope="module")
def models(encoder_fixture, decision_fixture) -> list[str]:  # type: ignore[no-untyped-def]
    return [str(encoder_fixture(v)) for v in ("embed", "classify", "rerank")] + [str(decision_fixture("llama"))]


@pytest.fixture(scope="module")
def server(models: list[str]) -> Iterator[str]:
    with running_server(*models, *SERVING) as base:
        yield base


@pytest.fixture(scope="module")
def batch_input(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("batch") / "in.jsonl"
    path.write_text("\n".join(_lines()) + "\n")
    return path


def _batch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "batch", *args], capture_output=True, text=True, env=subprocess_env(), timeout=600)


def _local(models: list[str], source: Path, out: Path) -> subprocess.CompletedProcess[str]:
    flags = [f for m in models for f in ("--model", m)]
    return _batch(str(source), str(out), *flags, *SERVING)


def _online(server: str, source: Path) -> list[tuple[str | None, object]]:
    """What each good line gets posted alone; the bad lines' error codes, by hand."""
    answers: list[tuple[str | None, object]] = []
    with httpx.Client(base_url=server, timeout=120) as client:
        seen: set[str] = set()
        for text in source.read_text().splitlines():
            try:
                line = json.loads(text)
            except ValueError:
                answers.append((None, "invalid_json"))
                continue
            if line["custom_id"] in seen:
                answers.append((line["custom_id"], "duplicate_custom_id"))
                continue
            seen.add(line["custom_id"])
            if line["url"] == "/v1/chat/completions":
                answers.append((line["custom_id"], "unknown_url"))
                continue
            r = client.post(line["url"], json=line["body"])
            answers.append((line["custom_id"], (r.status_code, _sans_id(r.json()))))
    return answers


def _sans_id(body: dict) -> dict:
    """An answer less the id a rerank answer draws for itself (each request gets its own)."""
    return {k: v for k, v in body.items() if k != "id"}


def _read(out: Path) -> list[tuple[str | None, object]]:
    """Each output line's custom_id and (status, body), or its error code, ids and timings aside."""
    rows: list[tuple[str | None, object]] = []
    for text in out.read_text().splitlines():
        line = json.loads(text)
        assert line["id"].startswith("batch_req_") and set(line) == {"id", "custom_id", "response", "error"}
        if line["error"] is not None:
            assert line["response"] is None and line["error"]["message"]
            rows.append((line["custom_id"], line["error"]["code"]))
        else:
            response = line["response"]
            assert response["request_id"]
            rows.append((line["custom_id"], (response["status_code"], _sans_id(response["body"]))))
    return rows


def test_batch_answers_equal_the_online_answers(
    server: str, models: list[str], batch_input: Path, tmp_path: Path
) -> None:
    online = _online(server, batch_input)
    statuses = [a[1][0] for a in online if isinstance(a[1], tuple)]
    assert statuses.count(200) == 32 and sorted(s for s in statuses if s != 200) == [400, 404]

    remote = _batch(str(batch_input), str(tmp_path / "remote.jsonl"), "--url", server, "--concurrency", "8")
    assert remote.returncode == 0, remote.stderr
    assert _read(tmp_path / "remote.jsonl") == online  # input order, the same bodies

    local = _local(models, batch_input, tmp_path / "local.jsonl")
    assert local.returncode == 0, local.stderr
    assert _read(tmp_path / "local.jsonl") == online
    assert "37 rows written (32 ok, 5 error lines)" in local.stderr.splitlines()[-1]  # not a TTY: the summary


def test_a_rerun_skips_what_is_written_and_redoes_a_torn_line(server: str, batch_input: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    first = _batch(str(batch_input), str(out), "--url", server)
    assert first.returncode == 0, first.stderr
    whole = out.read_bytes()
    cut = whole.index(b"\n", len(whole) // 2) + 25  # a crash halfway through writing a line
    out.write_bytes(whole[:cut])
    kept = whole[:cut].count(b"\n")

    again = _batch(str(batch_input), str(out), "--url", server)
    assert again.returncode == 0, again.stderr
    assert f"{kept} already in the output" in again.stderr
    assert _read(out) == _read_bytes(whole, tmp_path)  # the torn line redone, nothing twice
    rerun = _batch(str(batch_input), str(out), "--url", server)
    assert "0 rows written" in rerun.stderr and out.read_bytes().count(b"\n") == whole.count(b"\n")


def _read_bytes(data: bytes, tmp_path: Path) -> list[tuple[str | None, object]]:
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(data)
    return _read(copy)
