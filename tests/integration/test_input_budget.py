"""A model's input budget (upstream's `input: {max_tokens, overflow}`, issue 27 item 2), from a
models file through the served model, on every surface it applies to: a long input is cut under
`truncate` and refused under `reject` when the request sets no overflow of its own (classify,
embeddings, rerank, decisions); the golden check replays its recorded requests without the
budget; the result cache keeps the answers of two budgets apart; a default overflow the model
cannot honour is refused naming the deployment's setting. A refused input fails in its own slot
(R-API-10); a request's `options.max_tokens` may lower the budget, never raise it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.serving import serving
from vllm_srun.adapters.config.model_args import ModelArgs
from vllm_srun.adapters.config.models_file import load_models_file

LONG = "the movie was great fun " * 10  # 50 tokens, under the fixture's own 128-token limit
STATE = "the movie was great fun and the story was good " * 6  # a decision state of ~60 tokens
NOUL = {"type": "noul", "instructions": "is it good"}


def _entry(kind: str, folder: Path, name: str, budget: str = "") -> str:
    return f"  - {kind}: {folder}\n    name: {name}\n" + (f"    input: {{{budget}}}\n" if budget else "")


@pytest.fixture(scope="module")
def budgeted(encoder_fixture, decision_fixture, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    classify, embed, colbert = encoder_fixture("classify"), encoder_fixture("embed"), encoder_fixture("colbert")
    token = encoder_fixture("token")
    decision = decision_fixture("llama")
    path = tmp_path_factory.mktemp("budget") / "models.yaml"
    path.write_text(
        "models:\n"
        + _entry("model", classify, "cut", "max_tokens: 8, overflow: truncate")
        + _entry("artifact", classify, "strict", "max_tokens: 8, overflow: reject")
        + _entry("artifact", classify, "plain")
        + _entry("artifact", embed, "emb-cut", "max_tokens: 8, overflow: truncate")
        + _entry("artifact", embed, "emb-strict", "max_tokens: 8")
        + _entry("artifact", embed, "emb-plain")
        + _entry("artifact", colbert, "maxsim-window", "overflow: window")
        + _entry("artifact", token, "tok-cut", "max_tokens: 8, overflow: truncate")
        + _entry("artifact", token, "tok-strict", "max_tokens: 8")
        + _entry("artifact", token, "tok-window", "max_tokens: 8, overflow: window")
        + _entry("artifact", decision, "dec-cut", "max_tokens: 40, overflow: truncate")
        + _entry("artifact", decision, "dec-strict", "max_tokens: 40, overflow: reject")
        + _entry("artifact", decision, "dec-plain"),
        encoding="utf-8",
    )
    specs = load_models_file(path, flags=ModelArgs(), device="cpu", dtype_refusal=lambda dtype, device: None)
    with serving(specs) as (client, _):  # the golden check on, the result cache on (the defaults)
        yield client


def _cards(client: Any) -> dict[str, Any]:
    return {card["id"]: card for card in client.get("/v1/models").json()["data"]}


def test_the_golden_check_replays_without_the_budget(budgeted) -> None:  # type: ignore[no-untyped-def]
    # each fixture's golden file records inputs longer than its budget (e.g. classify windows of 16+)
    for name, card in _cards(budgeted).items():
        assert card["status"] == "ready", (name, card.get("reason"))
        assert card["golden"]["status"] == "matched", (name, card["golden"])


def test_truncate_cuts_a_long_input_instead_of_refusing_it(budgeted) -> None:  # type: ignore[no-untyped-def]
    answer = budgeted.post("/v1/classify", json={"model": "cut", "input": LONG})
    assert answer.status_code == 200, answer.text
    assert answer.json()["results"][0]["input"]["truncated"] is True
    assert answer.json()["usage"]["prompt_tokens"] == 8


def _failed(response: Any, index: int = 0) -> dict[str, Any]:
    """Item INDEX of a 200 answer, which failed in its slot (R-API-10)."""
    assert response.status_code == 200, response.text
    body = response.json()
    item = (body.get("results") or body.get("data"))[index]
    assert item["index"] == index and "error" in item, item
    return item


def test_reject_refuses_a_long_input_with_the_documented_error(budgeted) -> None:  # type: ignore[no-untyped-def]
    error = _failed(budgeted.post("/v1/classify", json={"model": "strict", "input": LONG}))
    assert error["error"] == "max_length_exceeded"
    assert "over the limit of 8 (the deployment's input.max_tokens)" in error["message"]
    assert 'options.overflow to "truncate"' in error["message"]


def test_options_max_tokens_lowers_the_budget_never_raises_it(budgeted) -> None:  # type: ignore[no-untyped-def]
    text = "the movie was great fun"  # 5 tokens and 2 special ones
    lower = budgeted.post("/v1/classify", json={"model": "plain", "input": text, "options": {"max_tokens": 6}})
    assert "over the limit of 6 (options.max_tokens)" in _failed(lower)["message"]
    fits = budgeted.post("/v1/classify", json={"model": "plain", "input": text, "options": {"max_tokens": 7}})
    assert fits.status_code == 200 and "error" not in fits.json()["results"][0]
    for model, most in (("strict", "the deployment's input.max_tokens of 8"), ("plain", "the model's limit of 128")):
        over = budgeted.post("/v1/classify", json={"model": model, "input": text, "options": {"max_tokens": 129}})
        assert over.status_code == 400 and f"options.max_tokens 129 is over {most}" in over.json()["error"]["message"]


def test_a_token_head_cuts_refuses_or_windows_at_the_budget(budgeted) -> None:  # type: ignore[no-untyped-def]
    asked = {"input": LONG, "options": {"return_tokens": True}}
    cut = budgeted.post("/v1/classify", json={"model": "tok-cut", **asked})
    assert cut.status_code == 200, cut.text
    result = cut.json()["results"][0]
    assert result["input"]["truncated"] is True and len(result["tokens"]) == 6  # 8 less [CLS] and [SEP]
    refused = _failed(budgeted.post("/v1/classify", json={"model": "tok-strict", **asked}))
    assert "over the limit of 8 (the deployment's input.max_tokens)" in refused["message"]
    windows = budgeted.post("/v1/classify", json={"model": "tok-window", **asked})
    assert windows.status_code == 200, windows.text
    read = windows.json()["results"][0]
    assert read["input"]["truncated"] is False and read["input"]["windows"] == len(read["windows"]) > 1
    assert max(w["tokens"] for w in read["windows"]) == 8  # the budget is the default window
    wide = budgeted.post("/v1/classify", json={"model": "tok-window", **asked, "options": {"window": {"tokens": 9}}})
    assert wide.status_code == 400 and "input.max_tokens" in wide.json()["error"]["message"]


def test_the_request_overrides_the_budget(budgeted) -> None:  # type: ignore[no-untyped-def]
    asked = budgeted.post("/v1/classify", json={"model": "cut", "input": LONG, "options": {"overflow": "reject"}})
    assert "input.max_tokens" in _failed(asked)["message"]


def test_the_result_cache_keeps_two_budgets_apart(budgeted) -> None:  # type: ignore[no-untyped-def]
    text = LONG + "again"
    answers = {}
    for name in ("plain", "cut", "plain", "cut"):  # each name asked twice: the second from the cache
        answer = budgeted.post("/v1/classify", json={"model": name, "input": text})
        assert answer.status_code == 200, answer.text
        result = answer.json()["results"][0]
        answers.setdefault(name, []).append((result["input"]["truncated"], result["probabilities"]))
    assert answers["plain"][0] == answers["plain"][1] and answers["cut"][0] == answers["cut"][1]
    assert answers["plain"][0][0] is False and answers["cut"][0][0] is True
    assert answers["plain"][0][1] != answers["cut"][0][1]
    metrics = budgeted.get("/metrics").text
    hits = [line for line in metrics.splitlines() if line.startswith("vllm_srun_result_cache_total") and "hit" in line]
    assert any('model="cut"' in line and not line.endswith(" 0.0") for line in hits), hits


def test_embeddings_cut_or_refuse_at_the_budget(budgeted) -> None:  # type: ignore[no-untyped-def]
    cut = budgeted.post("/v1/embeddings", json={"model": "emb-cut", "input": LONG})
    assert cut.status_code == 200, cut.text
    assert cut.json()["usage"]["prompt_tokens"] == 8
    plain = budgeted.post("/v1/embeddings", json={"model": "emb-plain", "input": LONG})
    assert plain.status_code == 200 and plain.json()["usage"]["prompt_tokens"] > 8
    assert plain.json()["data"][0]["embedding"] != cut.json()["data"][0]["embedding"]
    refused = _failed(budgeted.post("/v1/embeddings", json={"model": "emb-strict", "input": LONG}))
    message = refused["message"]
    assert refused["error"] == "max_length_exceeded" and "embedding" not in refused
    assert "over the limit of 8 (the deployment's input.max_tokens)" in message and "input[0]" in message
    asked = budgeted.post(
        "/v1/embeddings", json={"model": "emb-strict", "input": LONG, "options": {"overflow": "truncate"}}
    )
    assert asked.status_code == 200 and asked.json()["usage"]["prompt_tokens"] == 8
    short = budgeted.post("/v1/embeddings", json={"model": "emb-strict", "input": "the movie"})
    assert short.status_code == 200, short.text


def test_a_default_window_on_a_maxsim_reranker_names_the_deployment_setting(budgeted) -> None:  # type: ignore[no-untyped-def]
    body = {"model": "maxsim-window", "query": "the movie", "documents": ["great fun", "a story"]}
    refused = budgeted.post("/v1/rerank", json=body)
    assert refused.status_code == 400
    message = refused.json()["error"]["message"]
    assert "the deployment's input.overflow" in message and "MaxSim" in message
    asked = budgeted.post("/v1/rerank", json={**body, "options": {"overflow": "window"}})
    assert asked.status_code == 400 and "(options.overflow)" in asked.json()["error"]["message"]
    answered = budgeted.post("/v1/rerank", json={**body, "options": {"overflow": "reject"}})
    assert answered.status_code == 200, answered.text


def test_decisions_cut_the_state_or_fail_in_place_at_the_budget(budgeted) -> None:  # type: ignore[no-untyped-def]
    body = {"state": STATE, "questions": {"q": NOUL}}
    strict = budgeted.post("/v1/decisions", json={**body, "model": "dec-strict"}).json()
    assert strict["answers"]["q"]["error"] == "max_length_exceeded"
    assert "input.max_tokens=40" in strict["answers"]["q"]["message"]
    cut = budgeted.post("/v1/decisions", json={**body, "model": "dec-cut"}).json()
    assert 0 <= cut["answers"]["q"]["noul"] <= 1, cut
    assert 0 < cut["usage"]["input_tokens"] <= 40
    plain = budgeted.post("/v1/decisions", json={**body, "model": "dec-plain"}).json()
    assert plain["usage"]["input_tokens"] > 40
    short = budgeted.post("/v1/decisions", json={"state": "the movie", "questions": {"q": NOUL}, "model": "dec-strict"})
    assert 0 <= short.json()["answers"]["q"]["noul"] <= 1, short.text


def test_the_card_shows_the_budget(budgeted) -> None:  # type: ignore[no-untyped-def]
    cards = _cards(budgeted)
    assert cards["cut"]["input"] == {"max_tokens": 8, "overflow": "truncate"}
    assert cards["plain"]["input"] == {"max_tokens": None, "overflow": "reject"}


def test_the_budget_is_worker_flags_too(tmp_path: Path) -> None:
    from vllm_srun.adapters.config.settings import WorkerSettings

    argv = WorkerSettings(models=("m",), input_max_tokens=8, input_overflow="truncate").to_argv()
    assert "--input-max-tokens=8" in argv and "--input-overflow=truncate" in argv
