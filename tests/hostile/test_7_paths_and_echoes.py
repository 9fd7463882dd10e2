"""Issue 9, class 7: internal paths leaked — a model that failed to load gave its weights' file
path in `/health` and every 503 body — and a 1 MB `model` name was echoed whole in the 404.
Errors now name the model and the reason (the log keeps the path); echoed values are cut."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import httpx
import pytest

from tests.hostile.clients import Server, post, start

pytestmark = pytest.mark.slow


def test_a_failed_model_is_reported_without_its_path(encoder_fixture, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    broken = tmp_path / "private-store" / "broken-embed"
    shutil.copytree(encoder_fixture("embed"), broken)
    (broken / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}")
    argv = ["vllm_srun.app.cli", "serve", str(broken), "--log-level", "warning"]
    with start(argv, ready="/health/live") as worker:
        deadline = time.monotonic() + 60
        while (health := httpx.get(worker.base + "/health", timeout=5)).json()["status"] != "failed":
            assert time.monotonic() < deadline, health.text
            time.sleep(0.2)
        answer = post(worker, "/v1/embeddings", {"input": "x"})
        cards = httpx.get(worker.base + "/v1/models", timeout=5).json()["data"]
        assert health.status_code == 503 and answer.status_code == 503
        reason = health.json()["models"]["broken-embed"]["reason"]
        assert reason and "broken-embed" in answer.json()["error"]["message"]
        for text in (health.text, answer.text, cards[0]["reason"] or ""):
            assert str(tmp_path) not in text and "private-store" not in text, text
        assert str(tmp_path) in worker.log()  # the log keeps the path


def test_a_huge_model_name_is_not_echoed_whole(target: Server) -> None:
    answer = post(target, "/v1/embeddings", {"model": "m" * 1_000_000, "input": "x"})
    assert answer.status_code == 404 and answer.json()["error"]["code"] == "model_not_found"
    assert len(answer.content) < 500 and "1000002 characters" in answer.text
