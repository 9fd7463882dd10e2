"""Clients that go away or run out of time never cost a forward (R-API-9: 499, 504)."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from tests.e2e.server import running_server
from tests.e2e.test_embeddings_e2e import _metric

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def slow_window_server(minilm_dir) -> str:  # type: ignore[no-untyped-def]
    # a long batch window keeps rows queued long enough to leave or expire before any forward
    with running_server("--batch-window-ms", "1500") as base:
        yield base


def test_deadline_exceeded_drops_the_rows(slow_window_server: str) -> None:
    base = slow_window_server
    before = _metric(httpx.get(f"{base}/metrics").text, "vllm_srun_forwards_total")
    r = httpx.post(f"{base}/v1/embeddings", json={"input": "late", "options": {"deadline_ms": 50}}, timeout=10)
    assert r.status_code == 504 and r.json()["error"]["code"] == "deadline_exceeded"
    time.sleep(1.7)  # past the window: nothing left to run
    after = _metric(httpx.get(f"{base}/metrics").text, "vllm_srun_forwards_total")
    assert after == before


def test_client_that_goes_away_costs_no_forward(slow_window_server: str) -> None:
    base = slow_window_server
    host, port = base.removeprefix("http://").split(":")
    before = _metric(httpx.get(f"{base}/metrics").text, "vllm_srun_forwards_total")
    body = json.dumps({"input": "gone"}).encode()
    with socket.create_connection((host, int(port))) as s:
        s.sendall(
            b"POST /v1/embeddings HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            + f"content-length: {len(body)}\r\n\r\n".encode()
            + body
        )
        time.sleep(0.2)  # queued, inside the window
    time.sleep(2.0)
    text = httpx.get(f"{base}/metrics").text
    assert _metric(text, "vllm_srun_forwards_total") == before
    assert _metric(text, "vllm_srun_cancelled_requests_total") >= 1
    # and the server still answers
    assert httpx.post(f"{base}/v1/embeddings", json={"input": "still here"}, timeout=10).status_code == 200
