"""Every field validated before any row is queued (R-API-9), in-process: the token budget of a
request (`max_request_tokens`, 413), ids and integers beyond 64 bits, JSON nested too deep in
the fields that take any JSON value; none of them costs a forward."""

from __future__ import annotations

import json

import pytest

from tests.integration.serving import serving
from vllm_srun.adapters.model_card import model_card


def forwards(runtime) -> float:  # type: ignore[no-untyped-def]
    return sum(
        runtime.metrics.forwards.get({"model": name, "lane": lane, "outcome": "ok"})
        for name in runtime.models
        for lane in ("text", "shared")
    )


DEEP = "__deep__"


def with_deep(body: dict[str, object], levels: int) -> str:
    """BODY as JSON text with its DEEP placeholder replaced by arrays nested LEVELS deep."""
    return json.dumps(body).replace(json.dumps(DEEP), "[" * levels + '"x"' + "]" * levels)


def test_the_token_budget_is_checked_before_any_forward(encoder_fixture) -> None:  # type: ignore[no-untyped-def]
    fixture = encoder_fixture("embed")
    with serving([fixture], max_request_tokens=40) as (client, runtime):
        assert model_card(runtime.models["tiny-embed"])["limits"]["max_request_tokens"] == 40
        before = forwards(runtime)
        ok = client.post("/v1/embeddings", json={"input": ["one two"] * 4})
        assert ok.status_code == 200
        used = forwards(runtime) - before
        over = client.post("/v1/embeddings", json={"input": ["one two three four five six seven"] * 8})
        assert over.status_code == 413
        assert over.json()["error"]["code"] == "request_too_large" and "max_request_tokens" in over.text
        assert forwards(runtime) - before == used  # the refused request ran nothing


def test_the_budget_stops_windows_and_truncation_too(encoder_fixture) -> None:  # type: ignore[no-untyped-def]
    fixture = encoder_fixture("classify")
    with serving([fixture], max_request_tokens=200) as (client, runtime):
        before = forwards(runtime)
        long = " ".join(["word"] * 400)
        window = client.post("/v1/classify", json={"input": [long], "options": {"window": {"tokens": 32}}})
        truncate = client.post("/v1/classify", json={"input": [long] * 20, "options": {"overflow": "truncate"}})
        assert (window.status_code, truncate.status_code) == (413, 413)
        assert forwards(runtime) == before


def test_ids_and_integers_beyond_64_bits_cost_no_forward(decision_fixture) -> None:  # type: ignore[no-untyped-def]
    with serving([decision_fixture()]) as (client, runtime):
        before = forwards(runtime)
        questions = {"q": {"type": "noul", "instructions": "is it?"}}
        batch = {"states": [{"id": 2**64 + 1, "state": "x"}], "questions": questions}
        answer = client.post("/v1/systemone/batches", content=json.dumps(batch))
        assert answer.status_code == 400 and "states[0].id" in answer.json()["error"]["message"]
        state = client.post("/v1/decisions", content=json.dumps({"state": {"n": -(2**70)}, "questions": questions}))
        assert state.status_code == 400 and "beyond 64 bits" in state.text
        assert forwards(runtime) == before
        fine = {"states": [{"id": 2**63 - 1, "state": "x"}, {"id": "b", "state": "y"}], "questions": questions}
        ok = client.post("/v1/systemone/batches", content=json.dumps(fine))
        assert ok.status_code == 200 and [r["id"] for r in ok.json()["results"]] == [2**63 - 1, "b"]


@pytest.mark.parametrize("field", ["state", "instructions", "criteria"])
def test_deep_json_in_any_value_fields_is_a_400(decision_fixture, field: str) -> None:  # type: ignore[no-untyped-def]
    with serving([decision_fixture()]) as (client, runtime):
        before = forwards(runtime)
        for levels in (80, 990, 5000):
            question: dict[str, object] = {"type": "noul"}
            body: dict[str, object] = {"state": "s", "questions": {"q": question}}
            if field == "state":
                body["state"] = DEEP
            elif field == "instructions":
                question["instructions"] = DEEP
            else:
                question["criteria"] = {"true": DEEP}
            raw = with_deep(body, levels)
            answer = client.post("/v1/decisions", content=raw)
            assert answer.status_code == 400, (levels, answer.text)
            assert "deeper than 64 levels" in answer.json()["error"]["message"]
        assert forwards(runtime) == before


def test_deep_object_documents_in_rerank_are_a_400(encoder_fixture) -> None:  # type: ignore[no-untyped-def]
    with serving([encoder_fixture("rerank")]) as (client, runtime):
        before = forwards(runtime)
        raw = '{"query": "q", "documents": [{"text": "t", "meta": ' + "[" * 2000 + "]" * 2000 + "}]}"
        answer = client.post("/v1/rerank", content=raw)
        assert answer.status_code == 400 and "deeper than" in answer.text
        assert forwards(runtime) == before
