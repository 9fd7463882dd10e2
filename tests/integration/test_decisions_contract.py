"""The upstream contract's decision fields through the serving path (R-API-4/5): `states`,
`require_full_input` / `input_coverage`, `over`, typed parts, per-question `overflow`,
`thresholds`, per-question deadlines and `meta`; every answer checked against the contract's
shapes (`tests/contract_shapes.py`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.contract_shapes import check
from tests.integration.serving import serving
from vllm_srun.adapters.surfaces.decision_states import state_text
from vllm_srun.domain.settings.engine_args import EngineArgs

TOL = 1e-4
STATE = "the movie was great fun and the music was good"
NOUL = {"type": "noul", "instructions": "is the review positive"}
CHOICE = {"type": "choice", "instructions": "what is the tone", "choices": [{"key": "positive"}, {"key": "negative"}]}
SCORE = {"type": "score", "instructions": "how good", "levels": ["bad", "ok", "good"]}
SET = {"type": "set", "labels": ["fun", "music"]}


@pytest.fixture(scope="module")
def api(decision_fixture) -> Iterator[tuple[Any, Any]]:
    with serving([(decision_fixture("llama"), EngineArgs(batch_window_ms=0))], result_cache_entries=0) as (c, rt):
        served = next(iter(rt.models.values()))
        assert served.ready, served.reason
        yield c, served


def decide(client: Any, body: dict[str, Any], status: int = 200) -> dict[str, Any]:
    r = client.post("/v1/decisions", json=body)
    assert r.status_code == status, r.text
    got = r.json()
    assert check("DecisionResponse" if status == 200 else "ErrorResponse", got) == []
    return got


def close(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Two answers equal up to rounding (the same numbers, the same fields)."""
    assert set(a) == set(b), (a, b)
    for key, value in a.items():
        if isinstance(value, float):
            assert abs(value - b[key]) < TOL, key
        elif isinstance(value, dict):
            close(value, b[key])
        else:
            assert value == b[key], key


# ------------------------------------------------------------------------------ states
def test_each_state_is_answered_as_its_own_request_in_one_call(api) -> None:
    client, _ = api
    other = {"subject": "refund", "message": "charged twice"}
    body = {
        "state": STATE,
        "questions": {"n": NOUL},
        "states": {
            "ticket": {"state": other, "questions": {"c": CHOICE, "t": SET}},
            "again": {"state": STATE, "questions": {"s": SCORE}, "images": []},
        },
        "options": {"return_meta": True},
    }
    got = decide(client, body)
    assert set(got) >= {"model", "answers", "usage", "states", "meta"} and list(got["states"]) == ["ticket", "again"]
    own = decide(client, {"state": STATE, "questions": {"n": NOUL}})
    close(got["answers"], own["answers"])
    assert got["usage"] == own["usage"]  # the request's own state alone
    for name, entry in body["states"].items():
        alone = decide(client, {"state": entry["state"], "questions": entry["questions"]})
        mine = got["states"][name]
        assert mine["model"] == got["model"] and mine["usage"] == alone["usage"]
        close(mine["answers"], alone["answers"])
        assert mine.get("sets", {}).keys() == alone.get("sets", {}).keys()
        assert mine.get("thresholds") == alone.get("thresholds")
    assert got["states"]["ticket"]["thresholds"] == {"t": 0.5} and "meta" not in got["states"]["ticket"]


def test_question_names_repeat_across_states_and_errors_stay_in_their_state(api) -> None:
    client, _ = api
    body = {
        "state": STATE,
        "questions": {"q": {"type": "box"}},  # the request's own: invalid
        "states": {"s": {"state": STATE, "questions": {"q": NOUL}}},
    }
    got = decide(client, body)
    assert got["answers"]["q"]["error"] == "invalid_question" and got["usage"]["input_tokens"] == 0
    assert 0 <= got["states"]["s"]["answers"]["q"]["noul"] <= 1


def test_no_valid_question_in_any_state_is_a_400_listing_each(api) -> None:
    client, served = api
    before = served.scheduler_loop.forwards
    body = {
        "state": STATE,
        "questions": {"a": {"type": "noul", "instructions": " "}},
        "states": {"s": {"state": STATE, "questions": {"b": {"type": "score", "levels": ["one"]}}}},
    }
    error = decide(client, body, 400)["error"]
    assert error["code"] == "invalid_request"
    assert error["message"] == (
        "no question is valid (a: instructions must not be blank; states.s.b: levels must hold 2 to 10 levels (it holds 1))"
    )
    assert served.scheduler_loop.forwards == before


# ------------------------------------------------------------------------------ require_full_input
def test_require_full_input_proves_coverage_and_changes_no_answer(api) -> None:
    client, _ = api
    questions = {"n": NOUL, "c": CHOICE, "s": SCORE, "t": SET, "w": {"type": "span", "labels": ["fun"]}}
    plain = decide(client, {"state": STATE, "questions": questions})
    strict = decide(
        client,
        {"state": STATE, "questions": {k: {**q, "require_full_input": True} for k, q in questions.items()}},
    )
    for answer in strict["answers"].values():
        assert answer.pop("input_coverage") == "complete"
    assert strict["sets"]["t"].pop("input_coverage") == "complete"
    assert all("input_coverage" not in a for a in plain["answers"].values())
    close(strict["answers"], plain["answers"])
    assert strict["sets"] == plain["sets"] and strict["usage"] == plain["usage"]


@pytest.fixture(scope="module")
def cut(decision_fixture) -> Iterator[Any]:
    """The fixture with a deployment budget of 40 tokens that truncates."""
    args = EngineArgs(batch_window_ms=0, input_max_tokens=40, input_overflow="truncate")
    with serving([(decision_fixture("llama"), args)], result_cache_entries=0) as (client, _):
        yield client


LONG_STATE = "the movie was great fun and the story was good " * 6  # about 60 tokens


def test_require_full_input_is_never_cut(cut) -> None:
    body = {"state": LONG_STATE, "questions": {"cut": NOUL, "whole": {**NOUL, "require_full_input": True}}}
    got = decide(cut, body)
    assert 0 <= got["answers"]["cut"]["noul"] <= 1 and "input_coverage" not in got["answers"]["cut"]
    assert got["answers"]["whole"]["error"] == "max_length_exceeded" and "input_coverage" not in got["answers"]["whole"]
    assert "input.max_tokens=40" in got["answers"]["whole"]["message"]
    short = decide(cut, {"state": "the movie", "questions": {"whole": {**NOUL, "require_full_input": True}}})
    assert short["answers"]["whole"]["input_coverage"] == "complete"


def test_overflow_truncate_cuts_only_its_questions_state(api) -> None:
    client, served = api
    limit = served.model.max_input_tokens
    state = "the movie was great fun " * (limit // 4)  # over the fixture's input limit
    got = decide(client, {"state": state, "questions": {"plain": NOUL, "cut": {**NOUL, "overflow": "truncate"}}})
    assert got["answers"]["plain"]["error"] == "max_length_exceeded"
    assert 0 <= got["answers"]["cut"]["noul"] <= 1
    assert 0 < got["usage"]["input_tokens"] <= limit


# ------------------------------------------------------------------------------ over and typed parts
def test_over_reads_only_the_named_fields(api) -> None:
    client, _ = api
    state = {"title": "a review", "body": STATE, "stars": 4}
    got = decide(
        client,
        {
            "state": state,
            "questions": {
                "one": {**NOUL, "over": "body"},
                "two": {**NOUL, "over": ["stars", "title"]},
                "all": NOUL,
                "missing": {**NOUL, "over": "nope"},
            },
        },
    )
    close(got["answers"]["one"], decide(client, {"state": STATE, "questions": {"one": NOUL}})["answers"]["one"])
    two = decide(client, {"state": {"title": "a review", "stars": 4}, "questions": {"two": NOUL}})
    close(got["answers"]["two"], two["answers"]["two"])
    assert got["answers"]["missing"] == {
        "type": "noul",
        "error": "invalid_question",
        "message": "over names 'nope', which is not a field of the state",
    }
    text = decide(client, {"state": STATE, "questions": {"o": {**NOUL, "over": "body"}}}, 400)
    assert "this state is text" in text["error"]["message"]


def test_typed_parts_are_read_as_labelled_sections(api) -> None:
    client, _ = api
    state = {"context": "Our shop ships in two days.", "request": "When will it ship?", "answer": "In two days."}
    typed = decide(client, {"state": state, "questions": {"q": NOUL, "w": {"type": "span", "labels": ["time"]}}})
    as_text = decide(client, {"state": state_text(state), "questions": {"q": NOUL}})
    close(typed["answers"]["q"], as_text["answers"]["q"])
    for span in typed["spans"]["w"]:  # a span reads the answer part
        assert "In two days."[span["start"] : span["end"]] == span["text"]
    plain = {"subject": "refund", "message": "charged twice"}  # no typed part: read as JSON, as before
    assert state_text(plain) == '{"subject": "refund", "message": "charged twice"}'


# ------------------------------------------------------------------------------ thresholds, deadline, meta
def test_thresholds_list_the_one_applied(api) -> None:
    client, _ = api
    got = decide(client, {"state": STATE, "questions": {"a": SET, "b": {**SET, "threshold": 0.0}}})
    assert got["thresholds"] == {"a": 0.5, "b": 0.0}
    assert got["sets"]["b"]["selected"] == ["fun", "music"]


def test_questions_not_started_by_the_deadline_fail_in_their_slots(api) -> None:
    client, served = api
    before = served.scheduler_loop.forwards
    body = {
        "state": STATE,
        "questions": {"n": NOUL, "t": SET, "bad": {"type": "box"}},
        "options": {"deadline_ms": 1e-6},
    }
    got = decide(client, body)
    assert got["answers"]["n"] == {
        "type": "noul",
        "error": "deadline_exceeded",
        "message": "the question was not started before options.deadline_ms",
    }
    assert got["answers"]["t"]["error"] == "deadline_exceeded" and got["answers"]["t"]["type"] == "set"
    assert got["answers"]["bad"]["error"] == "invalid_question" and got["usage"]["input_tokens"] == 0
    assert "sets" not in got and served.scheduler_loop.forwards == before


def test_meta_when_asked(api) -> None:
    client, _ = api
    got = decide(client, {"state": STATE, "questions": {"n": NOUL}, "options": {"return_meta": True}})
    assert check("ResponseMeta", got["meta"]) == [] and got["meta"]["rows"] == 1
    assert "meta" not in decide(client, {"state": STATE, "questions": {"n": NOUL}})


def test_systemone_batches_keep_working(api) -> None:
    client, _ = api
    r = client.post(
        "/v1/systemone/batches",
        json={"states": [{"id": 1, "state": STATE}, {"id": "b", "state": "x"}], "questions": {"t": SET, "n": NOUL}},
    )
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["id"] for x in results] == [1, "b"] and all(x["thresholds"] == {"t": 0.5} for x in results)
    none = client.post("/v1/systemone/batches", json={"states": [{"id": 1, "state": "x"}], "questions": {"q": {}}})
    assert none.status_code == 400 and "states[0].q: type must be one of" in none.json()["error"]["message"]
