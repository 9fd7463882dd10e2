"""Set and span questions end to end (R-OUT-6): a real `vllm-srun serve` process answers them on
/v1/decisions in upstream's shapes, and the official `typesafe-sdk` client, unmodified, sends them
as plain question dicts and reads each label's noul answer."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.server import running_server

typesafe_sdk = pytest.importorskip("typesafe_sdk")

pytestmark = pytest.mark.slow
STATE = "Alice flew from Paris to Rome and paid twice"
QUESTIONS = {
    "topics": {"type": "set", "instructions": "Which topics?", "labels": ["travel", "billing"], "threshold": 0.5},
    "where": {"type": "span", "labels": ["city"], "threshold": 0.0},
}


@pytest.fixture(scope="module")
def server(decision_fixture) -> Iterator[str]:
    with running_server(str(decision_fixture("llama")), "--result-cache-entries", "0") as base:
        yield base


def test_set_and_span_over_http_and_through_the_sdk(server: str) -> None:
    r = httpx.post(f"{server}/v1/decisions", json={"state": STATE, "questions": QUESTIONS}, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    probs = body["sets"]["topics"]["probabilities"]
    assert body["sets"]["topics"]["selected"] == [k for k in ("travel", "billing") if probs[k] >= 0.5]
    assert [(s["label"], s["start"], s["end"], s["text"]) for s in body["spans"]["where"]] == [
        ("city", 0, len(STATE), STATE)
    ]
    with typesafe_sdk.TypeSafeClient(api_key="unused", base_url=server, model="tiny-decision-llama") as client:
        result = client.system_one(state=STATE, questions=QUESTIONS)
    assert set(result.nouls) == {"topics.travel", "topics.billing", "where"}
    for label, p in probs.items():
        assert abs(result.nouls[f"topics.{label}"].noul - p) < 1e-4
    bad = httpx.post(
        f"{server}/v1/decisions",
        json={"state": STATE, "questions": {"q": {"type": "set", "labels": ["a"], "threshold": 2}}},
        timeout=60,
    )
    assert bad.status_code == 400 and "threshold" in bad.json()["error"]["message"]
