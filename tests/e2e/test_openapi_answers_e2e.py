"""Every answer an e2e test gets from a worker goes through the OpenAPI check
(`tests/e2e/conftest.py`, `tests/openapi_check.py`), whatever client asked; a front's does not."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests import openapi_check


def test_every_worker_answer_is_checked(minilm_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, str, int]] = []

    def recorded(method: str, path: str, status: int, content_type: str, body: bytes) -> list[str]:
        seen.append((method, path, status))
        return ["a departure the check must report"] if path == "/health/live" else []

    monkeypatch.setattr(openapi_check, "response_problems", recorded)
    httpx.get(f"{minilm_server}/health")
    with pytest.raises(AssertionError, match="a departure the check must report"):
        httpx.get(f"{minilm_server}/health/live")
    client = openai.OpenAI(base_url=f"{minilm_server}/v1", api_key="none", max_retries=0)
    client.embeddings.create(model="all-MiniLM-L6-v2", input="checked too")
    assert seen == [("GET", "/health", 200), ("GET", "/health/live", 200), ("POST", "/v1/embeddings", 200)]
