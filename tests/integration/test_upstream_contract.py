"""A worker serving an embedder, a classifier (single- and multi-label), a reranker and a decision
model, asked the ordinary calls of the upstream router's client: every answer is checked against
the upstream contract's shapes (OpenAPI 2.3.0, `tests/contract_shapes.py`).

Each call names the helper of issue 43 whose work makes it conform (`h1` cards, health, errors,
meta, timing and metrics; `h2` the classify, embeddings and rerank answers; `h3` decisions), so a
failure says whose part is still missing. None is skipped or expected to fail: a call that does
not conform fails here until its part lands.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.contract_shapes import check
from tests.integration.serving import serving
from tests.prometheus_text import metric
from vllm_srun.adapters.schemas.common import API_VERSION

EMBED, CLASSIFY, MULTI, RERANK = "tiny-embed", "tiny-classify", "tiny-multilabel", "tiny-rerank"
DECIDE = "tiny-decision-llama"
LONG = "the movie was great fun " * 60  # 300 tokens: over the fixtures' 128-token limit
STATE = "The customer asked for a refund of order 1234 and was polite."
QUESTIONS = {
    "polite": {"type": "noul", "instructions": "Is the customer polite?"},
    "topic": {"type": "choice", "instructions": "What is it about?", "criteria": {"billing": None, "shipping": None}},
    "urgency": {"type": "score", "instructions": "How urgent is it?", "criteria": ["low", "medium", "high"]},
}

# (name, owner, method, path, body, expected status, contract shape)
CALLS: list[tuple[str, str, str, str, dict[str, Any] | None, int, str]] = [
    ("health", "h1", "GET", "/health", None, 200, "Health"),
    ("liveness", "h1", "GET", "/health/live", None, 200, "Liveness"),
    ("models", "h1", "GET", "/v1/models", None, 200, "ModelList"),
    ("unknown route", "h1", "GET", "/v1/nothing-here", None, 404, "ErrorResponse"),
    ("wrong method", "h1", "GET", "/v1/classify", None, 405, "ErrorResponse"),
    ("unknown model", "h1", "POST", "/v1/embeddings", {"model": "nobody", "input": "x"}, 404, "ErrorResponse"),
    ("not a surface of the model", "h1", "POST", "/v1/rerank", {"model": EMBED, "query": "q", "documents": ["d"]}, 422, "ErrorResponse"),
    ("embeddings", "h2", "POST", "/v1/embeddings", {"model": EMBED, "input": ["first text", "second"]}, 200, "EmbeddingsResponse"),
    ("embeddings base64", "h2", "POST", "/v1/embeddings", {"model": EMBED, "input": "x", "encoding_format": "base64"}, 200, "EmbeddingsResponse"),
    ("embeddings with meta", "h2", "POST", "/v1/embeddings", {"model": EMBED, "input": "x", "options": {"return_meta": True}}, 200, "EmbeddingsResponse"),
    ("embeddings, one input too long", "h2", "POST", "/v1/embeddings", {"model": EMBED, "input": ["short", LONG]}, 200, "EmbeddingsResponse"),
    ("classify", "h2", "POST", "/v1/classify", {"model": CLASSIFY, "input": ["great fun", "bad"]}, 200, "ClassifyResponse"),
    ("classify pairs", "h2", "POST", "/v1/classify", {"model": CLASSIFY, "input": [{"text": "refund", "text_pair": "billing"}]}, 200, "ClassifyResponse"),
    ("classify multi-label", "h2", "POST", "/v1/classify", {"model": MULTI, "input": "great fun"}, 200, "ClassifyResponse"),
    ("classify windows", "h2", "POST", "/v1/classify", {"model": CLASSIFY, "input": LONG, "options": {"overflow": "window"}}, 200, "ClassifyResponse"),
    ("classify with meta", "h2", "POST", "/v1/classify", {"model": CLASSIFY, "input": "x", "options": {"return_meta": True}}, 200, "ClassifyResponse"),
    ("classify, one input too long", "h2", "POST", "/v1/classify", {"model": CLASSIFY, "input": ["short", LONG]}, 200, "ClassifyResponse"),
    ("rerank", "h2", "POST", "/v1/rerank", {"model": RERANK, "query": "refund", "documents": ["billing", "weather"]}, 200, "RerankResponse"),
    ("rerank with documents", "h2", "POST", "/v1/rerank", {"model": RERANK, "query": "q", "documents": ["a", "b"], "top_n": 1, "return_documents": True}, 200, "RerankResponse"),
    ("decisions", "h3", "POST", "/v1/decisions", {"model": DECIDE, "state": STATE, "questions": QUESTIONS}, 200, "DecisionResponse"),
    ("decisions, router config's ordered forms", "h3", "POST", "/v1/decisions", {"model": DECIDE, "state": STATE, "questions": {
        "topic": {"type": "choice", "instructions": "About?", "choices": [{"key": "billing"}, {"key": "shipping", "description": "parcels"}]},
        "urgency": {"type": "score", "instructions": "Urgent?", "levels": ["low", "high"]},
    }}, 200, "DecisionResponse"),
    ("decisions, an invalid question in its slot", "h3", "POST", "/v1/decisions", {"model": DECIDE, "state": STATE, "questions": {
        "polite": QUESTIONS["polite"], "odd": {"type": "colour", "instructions": "?"},
    }}, 200, "DecisionResponse"),
    ("systemone alias", "h3", "POST", "/v1/systemone", {"model": DECIDE, "state": STATE, "questions": QUESTIONS}, 200, "DecisionResponse"),
    ("bundle", "h2+h3", "POST", "/v1/bundle", {"tasks": [
        {"id": "e", "embeddings": {"model": EMBED, "input": "x"}},
        {"id": "c", "classify": {"model": CLASSIFY, "input": "x"}},
        {"id": "r", "rerank": {"model": RERANK, "query": "q", "documents": ["a"]}},
        {"id": "d", "decisions": {"model": DECIDE, "state": STATE, "questions": {"polite": QUESTIONS["polite"]}}},
    ]}, 200, "BundleResponse"),
]  # fmt: skip


@pytest.fixture(scope="module")
def worker(encoder_fixture, decision_fixture) -> Iterator[Any]:  # type: ignore[no-untyped-def]
    packages = [encoder_fixture("embed"), encoder_fixture("classify"), encoder_fixture("multilabel")]
    with serving([*packages, encoder_fixture("rerank"), decision_fixture()]) as (client, _):
        yield client


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "kind"),
    [pytest.param(*call[2:], id=f"{call[1]}: {call[0]}") for call in CALLS],
)
def test_an_ordinary_call_answers_as_the_contract_says(worker, method, path, body, status, kind) -> None:  # type: ignore[no-untyped-def]
    r = worker.request(method, path, json=body)
    assert r.status_code == status, r.text[:500]
    assert check(kind, r.json()) == []


def test_cards_speak_the_contract(worker) -> None:  # type: ignore[no-untyped-def]
    listed = worker.get("/v1/models").json()
    assert listed["api_version"] == API_VERSION and listed["limits"] == {
        "max_bundle_tasks": 64,
        "max_request_bytes": 8 * 1024 * 1024,
    }
    cards = {card["id"]: card for card in listed["data"]}
    for card in cards.values():
        assert check("ModelCard", card) == [], card["id"]
        assert len(card["model_sha256"]) == len(card["manifest_sha256"]) == 64 and "sha256" not in card
        assert card["repo"] is None and card["revision"] is None  # local folders
        assert card["accelerator"] == "cpu" and card["accelerator_validated"] is True
        assert card["parameters"] > 0 and card["profile"] == "exact"
        assert card["golden"]["status"] == "matched" and re.fullmatch(r"cpu/\w+", card["golden"]["reference"])
    assert cards[EMBED]["embedding"]["dimensions"] == [32] and cards[EMBED]["embedding"]["layers"] == [2]
    assert cards[CLASSIFY]["heads"][0] | {"labels": None} == {
        "name": "classify",
        "kind": "sequence",
        "labels": None,
        "inputs": ["text", "pair"],
        "default_threshold": None,
        "thresholds": None,
        "overflow": "reject",
        "window": None,
        "reduction": "max",
        "operating_point_sha256": None,
    }
    assert cards[MULTI]["heads"][0]["kind"] == "scores" and cards[MULTI]["heads"][0]["default_threshold"] == 0.5
    assert cards[RERANK]["rerank"]["exits"] == [cards[RERANK]["rerank"]["default"]]
    decide = cards[DECIDE]
    assert decide["question_types"] == ["noul", "choice", "score", "set", "span"] and decide["modalities"] == ["text"]
    assert {k: decide["limits"][k] for k in ("min_options", "max_options", "min_levels", "max_levels")} == {
        "min_options": 2,
        "max_options": 255,
        "min_levels": 2,
        "max_levels": 10,
    }


def test_health_names_the_contract_version_and_its_models(worker) -> None:  # type: ignore[no-untyped-def]
    health = worker.get("/health").json()
    assert health["api_version"] == API_VERSION and health["status"] == "ready" and health["reason"] is None
    assert health["model"] is None and set(health["models"]) == {EMBED, CLASSIFY, MULTI, RERANK, DECIDE}
    assert worker.get("/health/live").json() == {"api_version": API_VERSION, "status": "alive"}


def test_meta_says_which_model_answered(worker) -> None:  # type: ignore[no-untyped-def]
    card = {c["id"]: c for c in worker.get("/v1/models").json()["data"]}[EMBED]
    meta = worker.post("/v1/embeddings", json={"model": EMBED, "input": "x", "options": {"return_meta": True}}).json()[
        "meta"
    ]
    assert check("ResponseMeta", meta) == []
    assert meta["model_id"] == EMBED and meta["model_sha256"] == card["model_sha256"] and "revision" not in meta
    assert meta["accelerator"] == "cpu" and meta["profile"] == "exact" and meta["compute_ms"] == meta["forward_ms"]


def test_server_timing_has_the_seven_phases(worker) -> None:  # type: ignore[no-untyped-def]
    r = worker.post("/v1/embeddings", json={"model": EMBED, "input": ["timing " * 20, "phases"]})
    phases = {m[1]: float(m[2]) for m in re.finditer(r"(\w+);dur=(\d+\.\d+)", r.headers["server-timing"])}
    assert list(phases) == ["parse", "tokenize", "queue", "forward", "post", "serialize", "total"]
    assert phases["tokenize"] > 0 and phases["forward"] > 0 and phases["serialize"] > 0
    assert sum(ms for name, ms in phases.items() if name != "total") <= phases["total"] + 0.01


def test_metrics_describe_the_models_and_bundles(worker) -> None:  # type: ignore[no-untyped-def]
    worker.post("/v1/bundle", json={"tasks": [{"id": "a", "embeddings": {"model": EMBED, "input": "x"}}]})
    text = worker.get("/metrics").text
    for name in (EMBED, CLASSIFY, DECIDE):
        info = {"model": name, "revision": "local", "accelerator": "cpu", "device": "cpu", "profile": "exact"}
        family = "decision" if name == DECIDE else "encoder"
        labels = {**info, "family": family, "engine": "native"}
        assert metric(text, "vllm_srun_model_info", **labels) == 1.0, name
        assert metric(text, "vllm_srun_model_memory_bytes", model=name) > 10_000
    assert metric(text, "vllm_srun_bundle_tasks_count", tenant="default") >= 1


def test_every_in_process_answer_is_checked_against_our_document(worker, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from tests import openapi_check

    monkeypatch.setattr(openapi_check, "response_problems", lambda *answer: [f"seen {answer[:3]}"])
    with pytest.raises(AssertionError, match=r"seen \('GET', '/health/live', 200\)"):
        worker.get("/health/live")
