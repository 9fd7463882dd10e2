"""The input limit of decision models (R-LEN-1, R-GOLD-2): `max_model_len` lowers the package's
limit; a longer prompt fails in place before any forward, one exactly at the limit is read; the
card reports both; a limit below the golden questions fails the readiness check naming it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.serving import serving
from vllm_srun.adapters.families.decision_rows import AskedQuestion
from vllm_srun.domain.settings.engine_args import EngineArgs

LIMIT = 160  # above every golden prompt of the fixture, below the package's 1024
SHORT = {"type": "noul", "instructions": "is it good"}
LONG = {"type": "noul", "instructions": "is it good " * 60}


@pytest.fixture(scope="module")
def limited(decision_fixture) -> Iterator[tuple[Any, Any]]:
    # max_speed: shared context and merged rows, as the questions' limits are checked in both layouts
    limited = EngineArgs(max_model_len=LIMIT, profile="max_speed")
    with serving([(decision_fixture("llama"), limited)], result_cache_entries=0) as (
        client,
        rt,
    ):
        served = next(iter(rt.models.values()))
        assert served.ready, served.reason
        yield client, served


def prompt_tokens(model: Any, state: str, question: dict[str, Any]) -> int:
    prepared = model.prepare(state, [AskedQuestion("q", question["type"], question.get("instructions"))])
    return len(prepared.state_ids) + len(prepared.questions[0].ids)


def state_at(model: Any, question: dict[str, Any], total: int) -> str:
    """A state whose prompt with QUESTION has exactly TOTAL tokens (one fixture token per word)."""
    base = prompt_tokens(model, "", question)
    state = " ".join(["fun"] * (total - base))
    assert prompt_tokens(model, state, question) == total
    return state


def test_card_reports_the_lowered_limit(limited) -> None:
    client, _served = limited
    card = client.get("/v1/models").json()["data"][0]
    assert card["limits"]["max_input_tokens"] == LIMIT
    assert card["engine_args"]["max_model_len"] == LIMIT
    assert card["decision"]["package_max_input_tokens"] == 1024
    assert card["golden"]["status"] == "matched"


def test_unset_limit_is_null_and_the_package_limit_applies(decision_fixture) -> None:
    with serving([decision_fixture("llama")]) as (client, _):
        card = client.get("/v1/models").json()["data"][0]
    assert card["engine_args"]["max_model_len"] is None
    assert card["limits"]["max_input_tokens"] == 1024


def test_too_long_question_fails_in_place_and_siblings_are_answered(limited) -> None:
    client, served = limited
    forwards = served.scheduler_loop.forwards
    body = {
        "state": "the movie",
        "questions": {"short": SHORT, "long": LONG, "other": {**SHORT, "instructions": "fun"}},
        "options": {"return_meta": True},
    }
    r = client.post("/v1/decisions", json=body)
    assert r.status_code == 200, r.text
    answers = r.json()["answers"]
    assert answers["long"]["type"] == "noul"
    assert answers["long"]["error"] == "max_length_exceeded"
    assert "max_model_len=160" in answers["long"]["message"]
    assert 0 <= answers["short"]["noul"] <= 1 and 0 <= answers["other"]["noul"] <= 1
    assert r.json()["meta"]["rows"] in (1, 2)  # the too-long question took no row
    assert served.scheduler_loop.forwards == forwards + 1


def test_systemone_is_the_same_route(limited) -> None:
    """The contract's alias: a too-long question fails in its slot there too, before any forward
    of its own; a request whose only question is too long is still a 200 (it is not invalid)."""
    client, served = limited
    forwards = served.scheduler_loop.forwards
    r = client.post("/v1/systemone", json={"state": "the movie", "questions": {"short": SHORT, "long": LONG}})
    assert r.status_code == 200
    assert r.json()["answers"]["long"]["error"] == "max_length_exceeded"
    assert served.scheduler_loop.forwards == forwards + 1
    r = client.post("/v1/systemone", json={"state": "the movie", "questions": {"long": LONG}})
    assert r.status_code == 200 and r.json()["usage"]["input_tokens"] == 0
    assert served.scheduler_loop.forwards == forwards + 1  # nothing to run


def test_prompt_exactly_at_the_limit_is_read(limited) -> None:
    client, served = limited
    model = served.model
    at = state_at(model, SHORT, LIMIT)
    r = client.post("/v1/systemone", json={"state": at, "questions": {"q": SHORT}})
    assert r.status_code == 200, r.text
    over = at + " fun"
    r = client.post("/v1/decisions", json={"state": over, "questions": {"q": SHORT}})
    assert r.json()["answers"]["q"]["error"] == "max_length_exceeded"


def test_max_length_applies_to_shared_requests_too(limited) -> None:
    client, served = limited
    model = served.model
    at = state_at(model, SHORT, LIMIT)
    qs = {f"q{i}": SHORT for i in range(4)} | {"long": LONG}
    body = {"state": at, "questions": qs, "options": {"return_meta": True}}
    old = model.break_even
    try:
        from vllm_srun.domain.scheduling.shared_context import BreakEven

        model.break_even = BreakEven(0, "manifest")
        r = client.post("/v1/decisions", json=body).json()
    finally:
        model.break_even = old
    assert r["meta"]["rows"] == 1  # four questions, one shared row
    assert r["answers"]["long"]["error"] == "max_length_exceeded"
    assert all(0 <= r["answers"][f"q{i}"]["noul"] <= 1 for i in range(4))


def test_golden_check_fails_naming_max_model_len(decision_fixture) -> None:
    with serving([(decision_fixture("llama"), EngineArgs(max_model_len=20))]) as (client, rt):
        served = next(iter(rt.models.values()))
        card = client.get("/v1/models").json()["data"][0]
        health = client.get("/health")
        r = client.post("/v1/decisions", json={"state": "x", "questions": {"q": SHORT}})
    assert served.status == "failed"
    assert card["golden"]["status"] == "failed"
    assert "max_model_len" in card["golden"]["reason"] and "max_model_len" in card["reason"]
    assert health.status_code == 503
    assert r.status_code == 503


def test_limit_above_the_package_fails_the_load(decision_fixture) -> None:
    with serving([(Path(decision_fixture("llama")), EngineArgs(max_model_len=5000))]) as (_client, rt):
        served = next(iter(rt.models.values()))
    assert served.status == "failed"
    assert "max_model_len 5000" in served.reason and "1024" in served.reason
