"""Classify, embeddings and rerank as the upstream contract answers them (R-API-1/2/3) and their
items' errors (R-API-10), in-process: every answer of every head kind has the contract's shape
(`tests/contract_shapes.py`), alone and as a bundle's task (where it is the same answer); an item
that fails stays in its slot with its siblings answered, and costs no row; a deadline passed
before an item's rows started answers `deadline_exceeded` in that item's slot only; `head`,
`layer` and a rerank exit are the model's own; and the one field where the contract and Cohere's
clients collide, a reranked `document`, follows R-API-11."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.contract_shapes import check
from tests.fakes import FakeDevice
from tests.integration.serving import serving
from tests.integration.test_fake_family import fake_container
from tests.prometheus_text import metric
from tests.waiting import wait_until

LONG = "the movie was great fun " * 40  # 202 tokens with the special ones: over the fixtures' 128
SURFACES = {"classify": "ClassifyResponse", "embeddings": "EmbeddingsResponse", "rerank": "RerankResponse"}
PATHS = {"classify": "/v1/classify", "embeddings": "/v1/embeddings", "rerank": "/v1/rerank"}


@pytest.fixture(scope="module")
def served(encoder_fixture):  # type: ignore[no-untyped-def]
    folders = [encoder_fixture(v) for v in ("classify", "multilabel", "token", "embed", "rerank")]
    with serving(folders, result_cache_entries=0) as (client, runtime):
        yield client, runtime


def rows(client: Any, model: str) -> float:
    return metric(client.get("/metrics").text, "vllm_srun_rows_total", model=model)


def _requests(items: list[str]) -> list[tuple[str, str, dict[str, Any]]]:
    """(model, surface, body) of one request of every head kind over ITEMS."""
    return [
        ("tiny-classify", "classify", {"input": items}),
        ("tiny-multilabel", "classify", {"input": items}),
        ("tiny-token", "classify", {"input": items, "options": {"return_tokens": True}}),
        ("tiny-embed", "embeddings", {"input": items}),
        ("tiny-rerank", "rerank", {"query": "is it fun", "documents": items, "return_documents": True}),
    ]


def _answers(body: dict[str, Any]) -> list[dict[str, Any]]:
    """An answer's items in input order."""
    items = body.get("results") or body.get("data") or []
    return sorted(items, key=lambda item: item["index"])


def test_every_head_kind_answers_the_contract_alone_and_in_a_bundle(served) -> None:  # type: ignore[no-untyped-def]
    client, _ = served
    items = ["the movie was great fun", "a boring plot", "paris is in france"]
    tasks, alone = [], {}
    for n, (model, surface, body) in enumerate(_requests(items)):
        r = client.post(PATHS[surface], json={**body, "model": model})
        assert r.status_code == 200, r.text
        assert check(SURFACES[surface], r.json()) == [], (model, check(SURFACES[surface], r.json()))
        alone[str(n)] = r.json()
        tasks.append({"id": str(n), surface: {**body, "model": model}})
    kinds = [alone[str(n)].get("kind") for n in range(3)]
    assert kinds == ["sequence", "scores", "token"]
    bundle = client.post("/v1/bundle", json={"tasks": tasks})
    assert bundle.status_code == 200 and check("BundleResponse", bundle.json()) == [], bundle.text
    for result in bundle.json()["results"]:
        surface = next(s for s in SURFACES if s in result)
        answer, same = result[surface], alone[result["id"]]
        assert {k: v for k, v in answer.items() if k != "id"} == {k: v for k, v in same.items() if k != "id"}


@pytest.mark.parametrize("where", ["alone", "bundle"])
def test_one_bad_item_fails_in_its_slot_costs_no_row_and_the_others_are_answered(served, where: str) -> None:  # type: ignore[no-untyped-def]
    client, _ = served
    good = ["the movie was great fun", "paris is in france"]
    for (model, surface, body), (_, _, clean) in zip(_requests([good[0], LONG, good[1]]), _requests(good), strict=True):
        before = rows(client, model)
        if where == "alone":
            r = client.post(PATHS[surface], json={**body, "model": model})
            answer = r.json()
        else:
            r = client.post("/v1/bundle", json={"tasks": [{"id": "t", surface: {**body, "model": model}}]})
            assert r.json()["results"][0]["status"] == 200, r.text
            answer = r.json()["results"][0][surface]
        assert r.status_code == 200 and check(SURFACES[surface], answer) == [], (model, r.text)
        first, failed, last = _answers(answer)
        assert failed["error"] == "max_length_exceeded" and "over the limit of 128" in failed["message"], model
        assert set(failed) <= {"object", "index", "error", "message"}  # nothing else in a failed slot
        assert rows(client, model) - before == 2, model  # the siblings' rows only
        expected = _answers(client.post(PATHS[surface], json={**clean, "model": model}).json())
        strip = ("index", "relevance_score", "logit", "document", "input") if surface == "rerank" else ("index",)
        assert {k: v for k, v in first.items() if k not in strip} == {
            k: v for k, v in expected[0].items() if k not in strip
        }
        assert last["index"] == 2 and "error" not in last


def test_every_item_failed_is_still_an_answer_not_an_error(served) -> None:  # type: ignore[no-untyped-def]
    """As upstream answers it: 200 with every item's error in its slot, and no forward."""
    client, _ = served
    for model, surface, body in _requests([LONG, LONG]):
        before = rows(client, model)
        r = client.post(PATHS[surface], json={**body, "model": model})
        assert r.status_code == 200 and check(SURFACES[surface], r.json()) == [], r.text
        assert [item["error"] for item in _answers(r.json())] == ["max_length_exceeded"] * 2
        assert rows(client, model) == before
        usage = r.json()["usage"]
        assert usage.get("input_tokens", usage.get("prompt_tokens")) == 0


def test_head_is_the_models_own_and_meta_names_it(served) -> None:  # type: ignore[no-untyped-def]
    client, _ = served
    card = next(c for c in client.get("/v1/models").json()["data"] if c["id"] == "tiny-classify")
    name = card["heads"][0]["name"]
    ok = client.post(
        "/v1/classify", json={"model": "tiny-classify", "input": "x", "head": name, "options": {"return_meta": True}}
    )
    assert ok.status_code == 200 and ok.json()["head"] == name and ok.json()["meta"]["head"] == name
    unknown = client.post("/v1/classify", json={"model": "tiny-classify", "input": "x", "head": "pii"})
    assert unknown.status_code == 400 and f"this model's heads: {name}" in unknown.json()["error"]["message"]


def test_layer_and_rerank_exits_are_the_declared_ones(served) -> None:  # type: ignore[no-untyped-def]
    client, _ = served
    cards = {c["id"]: c for c in client.get("/v1/models").json()["data"]}
    (layer,) = cards["tiny-embed"]["embedding"]["layers"]
    asked = client.post(
        "/v1/embeddings", json={"model": "tiny-embed", "input": "x", "layer": layer, "options": {"return_meta": True}}
    )
    assert asked.status_code == 200
    representation = asked.json()["meta"]["representation"]
    assert (
        representation["layer"] == layer
        and representation["dimension"] == cards["tiny-embed"]["embedding"]["dimensions"][0]
    )
    assert representation["model_sha256"] == cards["tiny-embed"]["model_sha256"]
    refused = client.post("/v1/embeddings", json={"model": "tiny-embed", "input": "x", "layer": layer + 1})
    assert refused.status_code == 400 and f"its layers: {layer}" in refused.json()["error"]["message"]
    exit_ = cards["tiny-rerank"]["rerank"]["default"]
    body = {"model": "tiny-rerank", "query": "q", "documents": ["d"]}
    assert client.post("/v1/rerank", json={**body, "layer": exit_["layer"]}).status_code == 200
    assert client.post("/v1/rerank", json={**body, "dimensions": exit_["dimension"]}).status_code == 200
    wrong = client.post("/v1/rerank", json={**body, "dimensions": exit_["dimension"] - 1})
    assert wrong.status_code == 400 and "not a pair-scorer exit" in wrong.json()["error"]["message"]


def test_a_reranked_document_comes_back_in_the_form_the_request_sent(served) -> None:  # type: ignore[no-untyped-def]
    """R-API-11: strings (the contract) as strings; Cohere's form (an object document, or one of
    Cohere's own fields) as Cohere writes it; /v2/rerank always Cohere's."""
    client, _ = served
    docs = ["paris", "a dog"]
    base = {"model": "tiny-rerank", "query": "capital", "return_documents": True}
    plain = client.post("/v1/rerank", json={**base, "documents": docs}).json()
    assert check("RerankResponse", plain) == [] and {r["document"] for r in plain["results"]} == set(docs)
    for asked in (
        {"documents": [{"text": d} for d in docs]},
        {"documents": docs, "max_tokens_per_doc": 64},
        {"documents": [{"text": docs[0]}, docs[1]]},
    ):
        cohere = client.post("/v1/rerank", json={**base, **asked}).json()
        assert all(r["document"] == {"text": docs[r["index"]]} for r in cohere["results"]), cohere
    v2 = client.post("/v2/rerank", json={**base, "documents": docs}).json()
    assert all(r["document"] == {"text": docs[r["index"]]} for r in v2["results"])
    logit = plain["results"][0]
    assert logit["relevance_score"] == pytest.approx(1 / (1 + 2.718281828459045 ** -logit["logit"]))


def test_top_n_keeps_the_best_and_every_failed_document(served) -> None:  # type: ignore[no-untyped-def]
    client, _ = served
    body = {"model": "tiny-rerank", "query": "fun", "documents": ["a", LONG, "b", "c"], "top_n": 2}
    results = client.post("/v1/rerank", json=body).json()["results"]
    assert [r.get("error") for r in results] == [None, None, "max_length_exceeded"] and results[2]["index"] == 1


def test_a_passed_deadline_fails_only_the_items_not_started(fake_packages: list[Path]) -> None:
    """While a forward is held on the device: a request whose rows wait past its deadline answers
    `deadline_exceeded` in every item's slot at that deadline (200; none of its rows ever runs); in
    a bundle only the task whose deadline passed does, the other is answered once the device frees."""
    gate = threading.Event()
    gate.set()  # the load's own forwards run

    def held(tokens: int) -> float:
        assert gate.wait(30), "the test never let the forward finish"
        return 0.0

    with serving(fake_container(fake_packages[0], device=FakeDevice(cost=held), result_cache_entries=0)) as (
        client,
        rt,
    ):
        loop = rt.models["fake-a"].scheduler_loop
        before = rows(client, "fake-a")
        gate.clear()
        hog = threading.Thread(target=lambda: client.post("/v1/embeddings", json={"input": "the hog"}))
        hog.start()
        try:
            wait_until(lambda: loop.scheduler.in_flight == 1, what="the hog's forward held on the device")
            start = time.monotonic()
            late = client.post(
                "/v1/classify", json={"input": ["the cat", "a dog", "red"], "options": {"deadline_ms": 150}}
            )
            assert time.monotonic() - start < 10  # answered at its deadline, not when the device frees
            assert late.status_code == 200 and check("ClassifyResponse", late.json()) == [], late.text
            assert [r["error"] for r in late.json()["results"]] == ["deadline_exceeded"] * 3
            got: dict[str, Any] = {}
            tasks = [
                {"id": "soon", "rerank": {"query": "q", "documents": ["a", "b"], "options": {"deadline_ms": 150}}},
                {"id": "whenever", "embeddings": {"input": ["the cat", "a bird"]}},
            ]
            poster = threading.Thread(target=lambda: got.update(r=client.post("/v1/bundle", json={"tasks": tasks})))
            poster.start()
            time.sleep(0.5)  # past the first task's deadline, while the device is held
        finally:
            gate.set()
            hog.join(30)
        poster.join(30)
        answer = got["r"].json()
        assert got["r"].status_code == 200 and check("BundleResponse", answer) == [], got["r"].text
        soon, whenever = answer["results"]
        assert [r["error"] for r in soon["rerank"]["results"]] == ["deadline_exceeded"] * 2
        assert all("embedding" in d for d in whenever["embeddings"]["data"])
        assert rows(client, "fake-a") - before == 1 + 2  # the hog's row, the bundle's two embeddings
