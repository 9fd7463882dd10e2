"""Clients that go away or run out of time never cost a forward (R-API-9: 499, 504).

A large request keeps the device busy (`--max-num-seqs 1`: one row per forward), so the victim's
row is still queued when its deadline passes (it answers `deadline_exceeded` in its slot) or its
client leaves; the rows counter then shows that only the large request's rows ever reached the
device.
"""

from __future__ import annotations

import json
import socket
import threading

import httpx
import pytest

from tests.e2e.server import running_server
from tests.e2e.test_embeddings_e2e import _metric
from tests.prometheus_text import metric
from tests.waiting import wait_until

pytestmark = pytest.mark.slow
HOG_ROWS = 24


@pytest.fixture(scope="module")
def one_row_server(minilm_dir) -> str:  # type: ignore[no-untyped-def]
    with running_server("--max-num-seqs", "1", "--result-cache-entries", "0") as base:
        yield base


def _rows(base: str) -> float:
    return _metric(httpx.get(f"{base}/metrics").text, "vllm_srun_rows_total")


def _hog(base: str) -> threading.Thread:
    # interactive, as asked: unasked, a request this large runs as batch and a small one cuts in (R-FAIR-3)
    body = {
        "input": [f"{i} " + "a long sentence about nothing in particular " * 25 for i in range(HOG_ROWS)],
        "options": {"priority": "interactive"},
    }
    t = threading.Thread(target=lambda: httpx.post(f"{base}/v1/embeddings", json=body, timeout=120), daemon=True)
    t.start()
    wait_until(lambda: _gauge(base, "vllm_srun_queue_depth") > 0, what="the hog queued and running")
    return t


def _gauge(base: str, name: str) -> float:
    return metric(httpx.get(f"{base}/metrics").text, name)


def test_deadline_exceeded_drops_the_rows(one_row_server: str) -> None:
    base = one_row_server
    before = _rows(base)
    hog = _hog(base)
    r = httpx.post(f"{base}/v1/embeddings", json={"input": "late", "options": {"deadline_ms": 50}}, timeout=10)
    # the contract: work not started by the deadline is not run, its items answer deadline_exceeded
    # (R-API-10; before, the whole request answered 504)
    (late,) = r.json()["data"]
    assert r.status_code == 200 and late["error"] == "deadline_exceeded" and "embedding" not in late
    hog.join(120)
    assert _rows(base) - before == HOG_ROWS  # the late row never ran


def test_client_that_goes_away_costs_no_forward(one_row_server: str) -> None:
    base = one_row_server
    host, port = base.removeprefix("http://").split(":")
    before = _rows(base)
    cancelled_before = _metric(httpx.get(f"{base}/metrics").text, "vllm_srun_cancelled_requests_total")
    hog = _hog(base)
    body = json.dumps({"input": "gone"}).encode()
    with socket.create_connection((host, int(port))) as s:
        s.sendall(
            b"POST /v1/embeddings HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            + f"content-length: {len(body)}\r\n\r\n".encode()
            + body
        )
        wait_until(lambda: _gauge(base, "vllm_srun_unanswered_requests") == 2, what="queued behind the hog")
    hog.join(120)
    text = httpx.get(f"{base}/metrics").text
    assert _metric(text, "vllm_srun_rows_total") - before == HOG_ROWS
    assert _metric(text, "vllm_srun_cancelled_requests_total") == cancelled_before + 1
    assert httpx.post(f"{base}/v1/embeddings", json={"input": "still here"}, timeout=10).status_code == 200
