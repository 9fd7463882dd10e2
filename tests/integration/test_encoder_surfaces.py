"""The encoder family's classify and rerank surfaces (R-API-2/3), served in-process from fixture
packages written by `vllm-srun fixture` code: parity with `transformers`, windowing, errors (an
item's in its own slot, R-API-10), the result cache (R-PERF-3), meta (R-API-8), the readiness
check on the card (R-GOLD) and the upstream contract's shapes (`tests/contract_shapes.py`)."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.contract_shapes import check
from tests.integration.serving import serving
from tests.prometheus_text import metric
from vllm_srun.adapters.models.tokenization import TextTokenizer
from vllm_srun.adapters.prometheus import CONTENT_TYPE

VARIANTS = ("embed", "classify", "multilabel", "rerank")
LONG = "the movie was great fun " * 40  # 200 tokens: over the fixtures' 128-token limit
TOL = 1e-5


@pytest.fixture(scope="module")
def served(encoder_fixture):  # type: ignore[no-untyped-def]
    folders = {v: encoder_fixture(v) for v in VARIANTS}
    with serving(list(folders.values())) as (client, runtime):
        yield client, runtime, folders


def _reference_logits(folder: Path, items: list) -> np.ndarray:
    """transformers' BertForSequenceClassification, one row at a time (no padding)."""
    import transformers

    model = transformers.BertForSequenceClassification.from_pretrained(folder).eval()
    tok = TextTokenizer.from_folder(folder)
    out = []
    for item in items:
        enc = tok.encode([item])[0] if isinstance(item, str) else tok.encode_pairs([item])[0]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([enc.ids]), token_type_ids=torch.tensor([enc.type_ids])).logits
        out.append(logits[0].double().numpy())
    return np.stack(out)


ITEMS = [
    "this movie is great fun",
    "bad",
    "the plot was boring and the acting was terrible " * 3,
    ("refund my order", "billing team"),
    ("is it raining today", "the weather is sun and rain tomorrow"),
]


def _wire(item):  # type: ignore[no-untyped-def]
    return item if isinstance(item, str) else {"text": item[0], "text_pair": item[1]}


@pytest.mark.parametrize("variant", ["classify", "multilabel"])
def test_classify_matches_transformers(served, variant: str) -> None:  # type: ignore[no-untyped-def]
    client, _, folders = served
    r = client.post("/v1/classify", json={"model": f"tiny-{variant}", "input": [_wire(i) for i in ITEMS]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert check("ClassifyResponse", body) == []
    logits = _reference_logits(folders[variant], ITEMS)
    if variant == "multilabel":
        want = 1 / (1 + np.exp(-logits))
    else:
        e = np.exp(logits - logits.max(axis=1, keepdims=True))
        want = e / e.sum(axis=1, keepdims=True)
    field = "scores" if variant == "multilabel" else "probabilities"
    got = np.array([res[field] for res in body["results"]])
    assert np.abs(got - want).max() < TOL
    assert body["labels"] == (
        ["billing", "shipping", "urgent"] if variant == "multilabel" else ["negative", "neutral", "positive"]
    )
    assert body["head"] == "classify" and body["kind"] == ("scores" if variant == "multilabel" else "sequence")
    for res, p in zip(body["results"], want):
        if variant == "classify":
            assert res["label"] == body["labels"][int(np.argmax(p))] and "selected" not in res
        else:
            assert res["selected"] == [body["labels"][j] for j in np.argsort(-p) if p[j] >= 0.5] and "label" not in res
        assert res["input"]["truncated"] is False and "windows" not in res["input"] and "windows" not in res
        assert res["input"]["processed_tokens"] == res["input"]["tokens"]
    assert body["multi_label"] is (variant == "multilabel")
    assert body["usage"]["input_tokens"] == sum(res["input"]["tokens"] for res in body["results"])
    assert body["usage"]["output_tokens"] == 0


def test_rerank_matches_transformers_cross_encoder(served) -> None:  # type: ignore[no-untyped-def]
    client, _, folders = served
    query = "capital of france"
    docs = ["paris is the capital of france", "the river flows to the sea", "a cat", "money in the bank account", ""]
    r = client.post("/v1/rerank", json={"model": "tiny-rerank", "query": query, "documents": docs})
    assert r.status_code == 200, r.text
    body = r.json()
    want = 1 / (1 + np.exp(-_reference_logits(folders["rerank"], [(query, d) for d in docs])[:, 0]))
    scores = [res["relevance_score"] for res in body["results"]]
    assert scores == sorted(scores, reverse=True)
    assert sorted(res["index"] for res in body["results"]) == list(range(len(docs)))
    for res in body["results"]:
        assert abs(res["relevance_score"] - want[res["index"]]) < TOL
        assert "document" not in res
    assert body["usage"]["total_tokens"] > len(docs) and body["id"]


def test_rerank_request_shapes(served) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = served
    docs = ["paris", {"text": "river"}, "cat"]
    r = client.post(
        "/v2/rerank",
        json={"model": "tiny-rerank", "query": "q", "documents": docs, "top_n": 2, "return_documents": True},
    )
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert len(results) == 2
    for res in results:
        assert res["document"] == (
            {"text": docs[res["index"]]} if isinstance(docs[res["index"]], str) else docs[res["index"]]
        )
    fields = client.post(
        "/v1/rerank",
        json={
            "model": "tiny-rerank",
            "query": "q",
            "rank_fields": ["title", "body"],
            "documents": [{"title": "paris", "body": "capital"}],
        },
    )
    assert fields.status_code == 200, fields.text
    for bad in (
        {"documents": [{"title": "no text"}]},
        {"documents": ["a"], "max_chunks_per_doc": 2},
        {"documents": []},
        {"documents": ["a"], "top_n": 0},
        {"documents": ["a"], "colour": "blue"},
    ):
        r = client.post("/v1/rerank", json={"model": "tiny-rerank", "query": "q", **bad})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request", r.text


def test_long_input_is_rejected_truncated_or_windowed_never_silently_cut(served) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = served
    reject = client.post("/v1/classify", json={"model": "tiny-classify", "input": LONG})
    assert reject.status_code == 200 and check("ClassifyResponse", reject.json()) == []
    (failed,) = reject.json()["results"]  # fails in its slot (R-API-10), nothing else in it
    assert failed.keys() == {"index", "error", "message"} and failed["error"] == "max_length_exceeded"
    assert "202 tokens, over the limit of 128" in failed["message"] and "window" in failed["message"]
    assert reject.json()["usage"]["input_tokens"] == 0
    cut = client.post(
        "/v1/classify", json={"model": "tiny-classify", "input": LONG, "options": {"overflow": "truncate"}}
    )
    assert cut.status_code == 200
    info = cut.json()["results"][0]["input"]
    assert info == {"tokens": 202, "processed_tokens": 128, "truncated": True}
    assert cut.json()["usage"]["prompt_tokens"] == cut.json()["usage"]["input_tokens"] == 128
    tokens, overlap = 48, 12
    win = client.post(
        "/v1/classify",
        json={
            "model": "tiny-classify",
            "input": [LONG, "short one"],
            "options": {"overflow": "window", "window": {"tokens": tokens, "overlap": overlap}},
        },
    )
    assert win.status_code == 200, win.text
    body = win.json()
    assert check("ClassifyResponse", body) == []
    long_result, short_result = body["results"]
    windows = long_result["windows"]
    step = tokens - 2 - overlap
    assert len(windows) == long_result["input"]["windows"] == -(-(200 - overlap) // step)  # every token in a window
    assert long_result["input"] == {"tokens": 202, "processed_tokens": 202, "truncated": False, "windows": len(windows)}
    assert all(w["tokens"] <= tokens for w in windows)
    # content-token offsets (the contract's), each window `step` on from the one before
    assert [w["start"] for w in windows] == [k * step for k in range(len(windows))] and windows[-1]["end"] == 200
    assert all(w["end"] - w["start"] == w["tokens"] - 2 for w in windows)
    # and the same spans in characters (ours)
    assert windows[0]["char_start"] == 0 and windows[-1]["char_end"] == len(LONG.rstrip())
    assert all(a["char_start"] < b["char_start"] < a["char_end"] for a, b in itertools.pairwise(windows))
    per_window = np.array([w["probabilities"] for w in windows])
    assert long_result["probabilities"] == per_window.max(axis=0).tolist()
    assert long_result["label"] == body["labels"][int(np.argmax(long_result["probabilities"]))]
    assert short_result["input"]["windows"] == len(short_result["windows"]) == 1
    assert body["usage"]["prompt_tokens"] == sum(w["tokens"] for w in windows) + short_result["input"]["tokens"]
    # a window's span read on its own gives that window's answer
    span = LONG[windows[1]["char_start"] : windows[1]["char_end"]]
    alone = client.post("/v1/classify", json={"model": "tiny-classify", "input": span}).json()["results"][0]
    assert np.abs(np.array(alone["probabilities"]) - per_window[1]).max() < TOL
    # windows are asked for, and consistently
    for options in (
        {"overflow": "reject", "window": {"tokens": 48}},
        {"window": {"tokens": 500}},
        {"window": {"tokens": 48, "overlap": 46}},
    ):
        r = client.post("/v1/classify", json={"model": "tiny-classify", "input": LONG, "options": options})
        assert r.status_code == 400, (options, r.text)


def test_rerank_long_documents(served) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = served
    base = {"model": "tiny-rerank", "query": "is the movie fun", "documents": [LONG, "fun movie"]}
    refused = client.post("/v1/rerank", json=base)  # the long document fails in its slot, after the scored one
    assert refused.status_code == 200 and check("RerankResponse", refused.json()) == []
    scored, failed = refused.json()["results"]
    assert scored["index"] == 1 and scored["input"]["truncated"] is False
    assert failed["index"] == 0 and failed["error"] == "max_length_exceeded" and "relevance_score" not in failed
    assert client.post("/v2/rerank", json=base).status_code == 400  # Cohere's route: no per-document errors
    cut = client.post("/v1/rerank", json={**base, "max_tokens_per_doc": 20})
    assert cut.status_code == 200 and cut.json()["usage"]["prompt_tokens"] == (20 + 4 + 3) + (2 + 4 + 3)
    win = client.post(
        "/v1/rerank", json={**base, "options": {"overflow": "window", "window": {"tokens": 40, "overlap": 8}}}
    )
    assert win.status_code == 200, win.text
    scores = {res["index"]: res["relevance_score"] for res in win.json()["results"]}
    # the long document scores as its best window; the short one as itself
    short = client.post("/v1/rerank", json={**base, "documents": ["fun movie"]}).json()["results"][0]["relevance_score"]
    assert abs(scores[1] - short) < TOL and 0 < scores[0] < 1


def test_threshold_for_scores_and_token_heads_only(served) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = served
    r = client.post(
        "/v1/classify", json={"model": "tiny-multilabel", "input": "refund my order", "options": {"threshold": 0.0}}
    )
    assert r.status_code == 200 and len(r.json()["results"][0]["selected"]) == 3
    none = client.post(
        "/v1/classify", json={"model": "tiny-multilabel", "input": "refund my order", "options": {"threshold": 1.0}}
    )
    assert none.json()["results"][0]["selected"] == []
    single = client.post("/v1/classify", json={"model": "tiny-classify", "input": "x", "options": {"threshold": 0.3}})
    assert single.status_code == 400 and "sequence head" in single.json()["error"]["message"]


@pytest.mark.parametrize(
    ("path", "model"),
    [
        ("/v1/classify", "tiny-rerank"),
        ("/v1/classify", "tiny-embed"),
        ("/v1/rerank", "tiny-classify"),
        ("/v2/rerank", "tiny-embed"),
        ("/v1/embeddings", "tiny-classify"),
        ("/v1/embeddings", "tiny-rerank"),
    ],
)
def test_a_model_without_the_surface_answers_422(served, path: str, model: str) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = served
    body = (
        {"model": model, "input": "x"} if "rerank" not in path else {"model": model, "query": "q", "documents": ["d"]}
    )
    r = client.post(path, json=body)
    assert r.status_code == 422 and r.json()["error"]["code"] == "unsupported_surface"


def test_metrics_are_served_as_prometheus_text_0_0_4(served) -> None:  # type: ignore[no-untyped-def]
    client, _, _ = served
    assert client.get("/metrics").headers["content-type"] == CONTENT_TYPE


def test_repeated_request_is_a_cache_hit_and_costs_no_forward(served) -> None:  # type: ignore[no-untyped-def]
    client, runtime, _ = served
    # under the default profile (exact) the rows of a model that is not batch-invariant run alone (R-PROF-2)
    per_row = not runtime.models["tiny-classify"].scheduler_loop.scheduler.batch_invariant
    pair = 2 if per_row else 1  # the forwards of a request of two inputs

    def counts() -> tuple[float, float, float]:
        text = client.get("/metrics").text
        return (
            metric(text, "vllm_srun_result_cache_total", model="tiny-classify", outcome="hit"),
            metric(text, "vllm_srun_result_cache_total", model="tiny-classify", outcome="miss"),
            metric(text, "vllm_srun_forwards_total", model="tiny-classify"),
        )

    body = {"model": "tiny-classify", "input": ["cache me", {"text": "and", "text_pair": "me"}]}
    h0, m0, f0 = counts()
    first = client.post("/v1/classify", json=body).json()
    assert counts() == (h0, m0 + 1, f0 + pair)
    again = client.post("/v1/classify", json={**body, "options": {"return_meta": True, "deadline_ms": 5000}})
    assert counts() == (h0 + 1, m0 + 1, f0 + pair)  # a hit: no forward
    meta = again.json().pop("meta")
    assert again.json() | {} and {k: v for k, v in again.json().items() if k != "meta"} == first
    assert meta["cache_hit"] is True and meta["forwards"] == 0
    other = client.post("/v1/classify", json={**body, "input": ["cache me too"]})
    assert other.status_code == 200 and counts() == (h0 + 1, m0 + 2, f0 + pair + 1)
    rerank = {"model": "tiny-rerank", "query": "q", "documents": ["a", "b"]}
    ids = {client.post("/v2/rerank", json=rerank).json()["id"] for _ in range(2)}
    assert len(ids) == 2  # a cached answer still gets its own id


def test_meta_numerics_and_cards(served) -> None:  # type: ignore[no-untyped-def]
    client, runtime, _ = served
    cards = {c["id"]: c for c in client.get("/v1/models").json()["data"]}
    assert set(cards) == {f"tiny-{v}" for v in VARIANTS}
    for variant in VARIANTS:
        card = cards[f"tiny-{variant}"]
        assert card["ready"] and card["dtype"] == "float32" and card["family"] == "encoder"
        assert card["golden"]["status"] == "matched" and card["golden"]["checked"] == card["golden"]["matched"] == 2
        scheduler = runtime.models[card["id"]].scheduler_loop.scheduler
        assert card["numerics"] == ("exact" if scheduler.batch_invariant else "approximate")
    assert cards["tiny-classify"]["classify"] == {"labels": ["negative", "neutral", "positive"], "multi_label": False}
    assert cards["tiny-rerank"]["surfaces"] == ["rerank"] and cards["tiny-embed"]["surfaces"] == ["embeddings"]
    for path, body in (
        ("/v1/classify", {"model": "tiny-classify", "input": "meta please"}),
        ("/v1/rerank", {"model": "tiny-rerank", "query": "meta", "documents": ["a", "b", "c"]}),
        ("/v1/embeddings", {"model": "tiny-embed", "input": ["meta", "please"]}),
    ):
        meta = client.post(path, json={**body, "options": {"return_meta": True}}).json()["meta"]
        card = cards[body["model"]]
        # the default profile, exact: every answer is its rows' alone, whatever the probe found (R-PROF-1)
        assert card["profile"] == meta["profile"] == "exact" and meta["numerics"] == "exact"
        assert meta["dtype"] == "float32" and meta["device"] == "cpu"
        assert meta["forwards"] >= 1 and meta["rows"] == {"/v1/classify": 1, "/v1/rerank": 3}.get(path, 2)
    spec = client.get("/openapi.json").json()
    assert {"/v1/classify", "/v1/rerank", "/v2/rerank"} <= set(spec["paths"])
    posts = [op["post"]["operationId"] for op in spec["paths"].values() if "post" in op]
    assert len(posts) == len(set(posts)) >= 4  # unique operation ids
