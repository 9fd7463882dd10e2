"""The decision surfaces in-process (R-API-4/5/8/9): shapes (checked against the upstream
contract's), question errors in place, batches, limits on counts, refusals, the result cache, and
the Qwen3 fixture."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.contract_shapes import check
from tests.integration.serving import serving
from vllm_srun.adapters.surfaces.decision_layout import confidence

NOUL = {"type": "noul", "instructions": "is the review positive"}
CHOICE = {
    "type": "choice",
    "instructions": "what is the tone",
    "criteria": {"positive": None, "negative": "a bad review"},
}
SCORE = {"type": "score", "instructions": "how good", "criteria": ["bad", {"level": "ok"}, ["good", "great"]]}
STATE = "the movie was great fun and the music was good"


@pytest.fixture(scope="module")
def api(decision_fixture) -> Iterator[tuple[Any, Any]]:
    with serving([decision_fixture("llama")]) as (client, rt):
        served = next(iter(rt.models.values()))
        assert served.ready, served.reason
        yield client, served


def post(client: Any, path: str, body: dict[str, Any]) -> Any:
    return client.post(path, json=body)


def test_answer_shapes(api) -> None:
    client, _ = api
    r = post(client, "/v1/decisions", {"state": STATE, "questions": {"n": NOUL, "c": CHOICE, "s": SCORE}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert check("DecisionResponse", body) == []
    assert body["model"] == "tiny-decision-llama" and body["usage"]["output_tokens"] == 0
    n, c, s = body["answers"]["n"], body["answers"]["c"], body["answers"]["s"]
    assert set(n) == {"type", "noul"} and 0 <= n["noul"] <= 1
    assert set(c) == {"type", "choice", "confidence", "probabilities"}
    assert set(c["probabilities"]) == {"positive", "negative"} and c["choice"] in c["probabilities"]
    assert c["choice"] == max(c["probabilities"], key=c["probabilities"].get)
    assert c["confidence"] == confidence(list(c["probabilities"].values()))  # 1 − normalised entropy
    assert c["confidence"] < max(c["probabilities"].values())
    assert abs(sum(c["probabilities"].values()) - 1) < 1e-9
    assert set(s) == {"type", "score", "confidence", "legend", "probabilities"}
    assert s["confidence"] == confidence(list(s["probabilities"].values()))
    assert s["legend"] == {"0": "bad", "1": '{"level": "ok"}', "2": '["good", "great"]'}  # the text the model read
    assert abs(s["score"] - sum(int(k) * p for k, p in s["probabilities"].items())) < 1e-9
    assert 0 <= s["score"] <= 2


def test_object_and_array_states_and_described_outcomes(api) -> None:
    client, _ = api
    qs = {
        "urgent": {"type": "noul", "criteria": {"true": "needs attention today", "false": None}},
        "team": {"type": "choice", "criteria": {"billing team": None, "shipping team": "late order", "other": None}},
    }
    for state in ({"subject": "charged twice", "message": "refund"}, ["refund", "today"]):
        r = post(client, "/v1/systemone", {"state": state, "questions": qs})
        assert r.status_code == 200, r.text
        assert r.json()["answers"]["team"]["choice"] in ("billing team", "shipping team", "other")


def test_invalid_questions_fail_in_place(api) -> None:
    client, _served = api
    many = {f"option {i}": None for i in range(256)}
    qs = {
        "one": {"type": "choice", "criteria": {"x": None}},
        "many": {"type": "choice", "criteria": many},
        "levels": {"type": "score", "criteria": [str(i) for i in range(11)]},
        "bare": {"type": "noul"},
        "box": {"type": "box", "instructions": "the dog"},
        "colour": {"type": "set", "labels": ["a"], "colour": "red"},
        "nope": {"type": "nope"},
        "untyped": {"instructions": "what?"},
        "ok": NOUL,
    }
    for path in ("/v1/decisions", "/v1/systemone"):  # the alias answers the same
        r = post(client, path, {"state": STATE, "questions": qs})
        assert r.status_code == 200, r.text
        assert check("DecisionResponse", r.json()) == []
        a = r.json()["answers"]
        assert {name: a[name].get("error") for name in qs} == {**dict.fromkeys(qs, "invalid_question"), "ok": None}
        assert all(set(a[name]) == {"type", "error", "message"} for name in qs if name != "ok")
        assert [a[name]["type"] for name in ("box", "many", "colour", "nope", "untyped")] == [
            "box",
            "choice",
            "set",
            "nope",
            None,
        ]
        assert a["colour"]["message"] == "set questions do not take ['colour']"
        assert "2 to 255 options (it holds 256)" in a["many"]["message"]
        assert 0 <= a["ok"]["noul"] <= 1


def test_ordered_forms_answer_as_their_criteria(api) -> None:
    client, _ = api
    by_criteria = {
        "c": CHOICE,
        "s": {"type": "score", "instructions": "how good", "criteria": ["bad", "ok", "good"]},
        "n": {"type": "noul", "criteria": {"true": "a positive review"}},
        "t": {"type": "set", "labels": [{"key": "fun", "description": "enjoyable"}, {"key": "music"}]},
    }
    ordered = {
        "c": {
            "type": "choice",
            "instructions": "what is the tone",
            "choices": [{"key": "positive"}, {"key": "negative", "description": "a bad review"}],
        },
        "s": {"type": "score", "instructions": "how good", "levels": ["bad", "ok", "good"]},
        "n": {"type": "noul", "choices": [{"key": "true", "description": "a positive review"}]},
        "t": {"type": "set", "criteria": {"fun": "enjoyable", "music": None}},
    }
    one = post(client, "/v1/decisions", {"state": STATE, "questions": by_criteria}).json()
    two = post(client, "/v1/decisions", {"state": STATE, "questions": ordered}).json()
    assert one == two and check("DecisionResponse", two) == []
    assert two["thresholds"] == {"t": 0.5}


def test_every_question_invalid_is_a_400_listing_each_reason(api) -> None:
    client, served = api
    before = served.scheduler_loop.forwards
    qs = {"a": {"type": "box"}, "b": {"type": "set", "labels": ["x"], "colour": 1}, "c": {"type": "choice"}}
    for path in ("/v1/decisions", "/v1/systemone"):
        r = post(client, path, {"state": STATE, "questions": qs})
        assert r.status_code == 400 and check("ErrorResponse", r.json()) == []
        error = r.json()["error"]
        assert error["code"] == "invalid_request" and error["message"].startswith("no question is valid (a: box ")
        assert "b: set questions do not take ['colour']" in error["message"]
        assert "c: a choice question needs criteria or choices" in error["message"]
    assert served.scheduler_loop.forwards == before


def test_a_thousand_invalid_questions_cost_no_forward(api) -> None:
    client, served = api
    before = served.scheduler_loop.forwards
    qs = {f"q{i}": {"type": "nope", "junk": "x" * 50} for i in range(1024)}
    r = post(client, "/v1/decisions", {"state": STATE, "questions": qs})
    assert r.status_code == 400 and len(r.json()["error"]["message"]) < 5000
    assert r.json()["error"]["message"].endswith("more)")
    r = post(client, "/v1/decisions", {"state": STATE, "questions": {**qs, "q0": NOUL}})
    assert r.status_code == 200 and r.json()["answers"]["q1"]["error"] == "invalid_question"
    assert served.scheduler_loop.forwards == before + 1  # the one valid question


def test_255_options_and_10_levels_are_answered(api) -> None:
    client, _ = api
    pairs = [a + b for a in "ABCDEFGHIJ" for b in "ABCDEFGHIJKLMNOPQRSTUVWXYZ"][:255]  # one token each: keys by name
    lettered = {f"option {i}": None for i in range(60)}  # several tokens each: keys A..Z, AA, AB, ..
    qs = {
        "big": {"type": "choice", "criteria": dict.fromkeys(pairs)},
        "lettered": {"type": "choice", "criteria": lettered},
        "ten": {"type": "score", "criteria": [str(i) for i in range(10)]},
    }
    r = post(client, "/v1/systemone", {"state": STATE, "questions": qs})
    assert r.status_code == 200, r.text
    answers = r.json()["answers"]
    assert (
        list(answers["big"]["probabilities"]) == pairs and abs(sum(answers["big"]["probabilities"].values()) - 1) < 1e-9
    )
    assert list(answers["lettered"]["probabilities"]) == list(lettered)
    assert set(answers["ten"]["legend"]) == {str(i) for i in range(10)}


@pytest.mark.parametrize(
    "body, status, code",
    [
        ({"state": STATE, "questions": {}}, 400, "invalid_request"),
        ({"state": STATE, "questions": {"q": {"type": "nope"}}}, 400, "invalid_request"),
        ({"state": STATE, "questions": {"q": NOUL}, "extra": 1}, 400, "invalid_request"),
        ({"state": STATE, "questions": {"q": {**NOUL, "bogus": 1}}}, 400, "invalid_request"),
        ({"state": STATE, "questions": {f"q{i}": NOUL for i in range(1025)}}, 413, "request_too_large"),
        ({"state": STATE, "questions": {"q": NOUL}, "assets": {"img": {"type": "image"}}}, 422, "unsupported_surface"),
        ({"state": STATE, "questions": {"q": NOUL}, "images": ["data:image/png;base64,AA=="]}, 400, "invalid_request"),
        ({"state": STATE, "questions": {"q": NOUL}, "options": {"max_tokens": 100}}, 400, "invalid_request"),
        ({"state": STATE, "questions": {"q": NOUL}, "options": {"bogus": 1}}, 400, "invalid_request"),
        ({"state": STATE, "questions": {"q": NOUL}, "states": {"s": {"state": "x"}}}, 400, "invalid_request"),
        (
            {"state": STATE, "questions": {"q": NOUL}, "states": {"s": {"state": "x", "questions": {}}}},
            400,
            "invalid_request",
        ),
        (
            {
                "state": STATE,
                "questions": {"q": NOUL},
                "states": {"s": {"state": "x", "questions": {"q": NOUL}, "x": 1}},
            },
            400,
            "invalid_request",
        ),
        (
            {
                "state": STATE,
                "questions": {"q": NOUL},
                "states": {"s": {"state": "x", "questions": {"q": NOUL}, "images": ["x"]}},
            },
            400,
            "invalid_request",
        ),
        (
            {
                "state": STATE,
                "questions": {f"q{i}": NOUL for i in range(1000)},
                "states": {"s": {"state": "x", "questions": {f"q{i}": NOUL for i in range(25)}}},
            },
            413,
            "request_too_large",
        ),
        ({"state": STATE, "questions": {"q": NOUL}, "model": "nope"}, 404, "model_not_found"),
    ],
)
def test_bad_requests(api, body: dict[str, Any], status: int, code: str) -> None:
    client, _ = api
    for path in ("/v1/decisions", "/v1/systemone"):
        r = post(client, path, body)
        assert (r.status_code, r.json()["error"]["code"]) == (status, code), r.text


def test_batches(api) -> None:
    client, _ = api
    states = [{"id": "a", "state": STATE}, {"id": 7, "state": {"message": "refund"}}]
    qs = {"n": NOUL, "c": CHOICE, "bad": {"type": "choice", "criteria": {"x": None}}}
    r = post(client, "/v1/systemone/batches", {"states": states, "questions": qs})
    assert r.status_code == 200, r.text
    body = r.json()
    assert all(check("DecisionStateResponse", {"model": "m", **x}) == [] for x in body["results"])
    assert [x["id"] for x in body["results"]] == ["a", 7]
    assert body["usage"]["input_tokens"] == sum(x["usage"]["input_tokens"] for x in body["results"])
    single = post(client, "/v1/decisions", {"state": STATE, "questions": qs}).json()
    assert body["results"][0]["answers"]["bad"]["error"] == "invalid_question"
    assert abs(body["results"][0]["answers"]["n"]["noul"] - single["answers"]["n"]["noul"]) < 1e-4
    assert body["results"][0]["usage"] == single["usage"]
    dup = post(client, "/v1/systemone/batches", {"states": [states[0], states[0]], "questions": qs})
    assert dup.status_code == 400 and "unique" in dup.json()["error"]["message"]
    big = post(
        client, "/v1/systemone/batches", {"states": [{"id": i, "state": "x"} for i in range(342)], "questions": qs}
    )
    assert big.status_code == 413


def test_result_cache_answers_a_repeat_without_a_forward(api) -> None:
    client, served = api
    body = {"state": "a fresh state for the cache", "questions": {"n": NOUL}, "options": {"return_meta": True}}
    first = post(client, "/v1/decisions", body).json()
    before = served.scheduler_loop.forwards
    second = post(client, "/v1/systemone", body).json()
    assert second["meta"]["cache_hit"] is True and served.scheduler_loop.forwards == before
    assert second["answers"] == first["answers"]


def test_openapi_lists_the_decision_routes(api) -> None:
    client, _ = api
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/v1/decisions", "/v1/systemone", "/v1/systemone/batches"} <= set(paths)


def test_encoder_models_do_not_serve_decisions(encoder_fixture) -> None:
    with serving([encoder_fixture("embed")]) as (client, _):
        r = post(client, "/v1/decisions", {"state": STATE, "questions": {"q": NOUL}})
    assert r.status_code == 422 and r.json()["error"]["code"] == "unsupported_surface"


def test_qwen3_fixture_serves_with_its_golden_file(decision_fixture) -> None:
    with serving([decision_fixture("qwen3")]) as (client, _rt):
        card = client.get("/v1/models").json()["data"][0]
        r = post(client, "/v1/systemone", {"state": STATE, "questions": {"n": NOUL, "s": SCORE}})
    assert card["golden"]["status"] == "matched", card["golden"]
    assert card["decision"]["prompt_template"]["question"].endswith("<think>\n\n</think>\n\n")
    assert r.status_code == 200, r.text


def test_manifest_prompt_template_overrides_the_default(decision_fixture, tmp_path) -> None:
    import json
    import shutil

    folder = tmp_path / "tiny-plain"
    shutil.copytree(decision_fixture("llama"), folder)
    (folder / "golden.json").unlink()  # recorded with the ChatML template: answers change with the prompt
    manifest = json.loads((folder / "srun.json").read_text())
    manifest["prompt_template"] = {"state": "Text: {state}\n", "question": "{question}\nAnswer:", "answer_prefix": " "}
    (folder / "srun.json").write_text(json.dumps(manifest))
    with serving([folder]) as (client, _):
        card = client.get("/v1/models").json()["data"][0]
        r = post(client, "/v1/decisions", {"state": STATE, "questions": {"n": NOUL, "c": CHOICE, "s": SCORE}})
    assert card["decision"]["prompt_template"]["name"] == "manifest" and card["golden"]["status"] == "unverified"
    assert r.status_code == 200 and all("error" not in a for a in r.json()["answers"].values()), r.text
