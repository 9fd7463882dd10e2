"""Set and span questions through the serving path (R-OUT-6): the contract's shapes, equality with
the `transformers` reference on the decision fixture, shared == unshared, invalid questions
naming the field, errors in place, batches, and the `typesafe-sdk` response models reading our
answers."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from tests.contract_shapes import check
from tests.integration.serving import serving
from vllm_srun.adapters.surfaces.decision_labels import plan
from vllm_srun.adapters.surfaces.decision_questions import read_question
from vllm_srun.domain.settings.engine_args import EngineArgs

STATE = "Alice flew from Paris to Rome on Monday and paid twice for the ticket"
SET = {"type": "set", "instructions": "Which topics?", "labels": ["travel", {"key": "billing", "description": "money"}]}
SPAN = {"type": "span", "labels": ["person", "city"], "threshold": 0.55}
TOL = 1e-4


@pytest.fixture(scope="module")
def two_layouts(decision_fixture, tmp_path_factory) -> Iterator[Any]:
    """The llama fixture always shared (break-even 0) and never shared."""
    base = decision_fixture("llama")
    shared = tmp_path_factory.mktemp("labels") / "tiny-decision-shared"
    shutil.copytree(base, shared)
    manifest = json.loads((shared / "srun.json").read_text())
    manifest["shared_context"] = {"break_even_tokens": 0}
    (shared / "srun.json").write_text(json.dumps(manifest))
    models = [
        (shared, EngineArgs(batch_window_ms=0)),
        (base, EngineArgs(batch_window_ms=0, enable_shared_context=False)),
    ]
    with serving(models, result_cache_entries=0) as (client, rt):
        assert all(m.ready for m in rt.models.values())
        yield client, rt


def ask(client: Any, questions: dict[str, Any], model: str = "tiny-decision-llama", path: str = "/v1/decisions") -> Any:
    return client.post(path, json={"model": model, "state": STATE, "questions": questions})


def test_set_and_span_shapes(two_layouts) -> None:
    client, _ = two_layouts
    r = ask(client, {"topics": SET, "who": SPAN, "n": {"type": "noul", "instructions": "is it travel"}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert check("DecisionResponse", body) == []
    assert body["thresholds"] == {"topics": 0.5, "who": 0.55}
    answers, sets, spans = body["answers"], body["sets"], body["spans"]
    assert list(answers) == ["topics.travel", "topics.billing", "who", "n"]
    assert all(set(answers[k]) == {"type", "noul"} and answers[k]["type"] == "noul" for k in answers)
    assert set(sets) == {"topics"} and set(sets["topics"]) == {"selected", "probabilities"}
    probs = sets["topics"]["probabilities"]
    assert probs == {"travel": answers["topics.travel"]["noul"], "billing": answers["topics.billing"]["noul"]}
    assert sets["topics"]["selected"] == [k for k in ("travel", "billing") if probs[k] >= 0.5]
    assert set(spans) == {"who"}
    for s in spans["who"]:
        assert set(s) == {"label", "start", "end", "text", "probability"} and s["label"] in {"person", "city"}
        assert STATE[s["start"] : s["end"]] == s["text"] and s["probability"] >= 0.55
    # threshold 0: every word is in, so each label is one span over all the words
    everything = ask(client, {"w": {**SPAN, "threshold": 0.0}}).json()["spans"]["w"]
    assert [(s["label"], s["text"]) for s in everything] == [("person", STATE), ("city", STATE)]
    card = next(c for c in client.get("/v1/models").json()["data"] if c["id"] == "tiny-decision-llama")
    assert {"set", "span"} <= set(card["decision"]["question_types"])


def test_set_probabilities_equal_the_transformers_reference(two_layouts, decision_fixture) -> None:
    transformers = pytest.importorskip("transformers")
    client, rt = two_layouts
    reference = transformers.AutoModelForCausalLM.from_pretrained(decision_fixture("llama"), dtype=torch.float32).eval()
    model = rt.models["tiny-decision-llama"].model
    got = ask(client, {"topics": SET}).json()["sets"]["topics"]
    rows = plan("topics", read_question("topics", SET), STATE).rows
    prepared = model.prepare(STATE, rows)
    for label, q in zip(("travel", "billing"), prepared.questions):
        with torch.no_grad():
            logits = reference(input_ids=torch.tensor([prepared.state_ids + q.ids])).logits[0, -1].double()
        p_yes = torch.softmax(logits[list(q.answer_ids)], -1)[0].item()  # answer tokens: Yes, No
        assert abs(got["probabilities"][label] - p_yes) < TOL


def test_span_words_equal_the_transformers_reference(two_layouts, decision_fixture) -> None:
    transformers = pytest.importorskip("transformers")
    client, rt = two_layouts
    reference = transformers.AutoModelForCausalLM.from_pretrained(decision_fixture("llama"), dtype=torch.float32).eval()
    model = rt.models["tiny-decision-llama"].model
    state = "Bob went to Oslo"
    body = client.post(
        "/v1/decisions", json={"model": "tiny-decision-llama", "state": state, "questions": {"who": SPAN}}
    ).json()
    p = plan("who", read_question("who", SPAN), state)
    prepared = model.prepare(state, p.rows)
    with torch.no_grad():
        ps = [
            torch.softmax(
                reference(input_ids=torch.tensor([prepared.state_ids + q.ids]))
                .logits[0, -1]
                .double()[list(q.answer_ids)],
                -1,
            )[0].item()
            for q in prepared.questions
        ]
    assert abs(body["answers"]["who"]["noul"] - ps[0]) < TOL
    words = [state[a:b] for a, b in p.words]
    expected = []  # runs of consecutive words over the threshold, per label, written out here
    for li, label in enumerate(SPAN["labels"]):
        word_ps = ps[1 + li * len(words) : 1 + (li + 1) * len(words)]
        run: list[int] = []
        for wi in [*range(len(words)), len(words)]:
            if wi < len(words) and word_ps[wi] >= SPAN["threshold"]:
                run.append(wi)
            elif run:
                expected.append((p.words[run[0]][0], li, label, sum(word_ps[i] for i in run) / len(run)))
                run = []
    expected.sort()
    got = body["spans"]["who"]
    assert [(s["start"], s["label"]) for s in got] == [(e[0], e[2]) for e in expected]
    assert all(abs(s["probability"] - e[3]) < TOL for s, e in zip(got, expected))


def test_shared_equals_unshared(two_layouts) -> None:
    client, _ = two_layouts
    qs = {"topics": SET, "who": {**SPAN, "threshold": 0.0}}
    shared = ask(client, qs, "tiny-decision-shared").json()
    alone = ask(client, qs, "tiny-decision-llama").json()
    for k, a in alone["answers"].items():
        assert abs(shared["answers"][k]["noul"] - a["noul"]) < TOL
    for label, p in alone["sets"]["topics"]["probabilities"].items():
        assert abs(shared["sets"]["topics"]["probabilities"][label] - p) < TOL
    for a, b in zip(shared["spans"]["who"], alone["spans"]["who"], strict=True):
        assert (a["label"], a["start"], a["end"]) == (b["label"], b["start"], b["end"])
        assert abs(a["probability"] - b["probability"]) < TOL
    assert shared["usage"] == alone["usage"]


@pytest.mark.parametrize(
    ("question", "field"),
    [
        ({"type": "set", "labels": []}, "labels"),
        ({"type": "span", "labels": [f"l{i}" for i in range(256)]}, "labels"),
        ({"type": "set", "labels": ["a"], "threshold": 1.5}, "threshold"),
        ({"type": "span", "labels": ["a"], "threshold": -0.1}, "threshold"),
        ({"type": "set", "labels": ["a"], "criteria": {"a": None}}, "criteria"),
        ({"type": "span", "labels": [{"key": "a", "colour": "red"}]}, "colour"),
        ({"type": "set", "labels": [""]}, "labels"),
    ],
)
def test_bad_set_and_span_questions_fail_in_place_naming_the_field(two_layouts, question, field) -> None:
    client, _ = two_layouts
    r = ask(client, {"q": question, "ok": SET})
    assert r.status_code == 200, r.text
    failed = r.json()["answers"]["q"]
    assert failed["error"] == "invalid_question" and field in failed["message"] and failed["type"] == question["type"]
    alone = ask(client, {"q": question})  # no valid question at all: 400 naming it
    assert alone.status_code == 400 and alone.json()["error"]["code"] == "invalid_request"
    assert alone.json()["error"]["message"] == f"no question is valid (q: {failed['message']})"


def test_a_set_answer_taking_another_questions_name_fails_in_place(two_layouts) -> None:
    client, _ = two_layouts
    r = ask(client, {"t": {"type": "set", "labels": ["a"]}, "t.a": {"type": "noul", "instructions": "x"}})
    assert r.status_code == 200
    assert r.json()["answers"]["t"] == {
        "type": "set",
        "error": "invalid_question",
        "message": "labels: the answer 't.a' would take the name of another question",
    }
    assert 0 <= r.json()["answers"]["t.a"]["noul"] <= 1


def test_errors_stay_in_place(two_layouts) -> None:
    client, _ = two_layouts
    long_label = {"key": "long", "description": " ".join(["word"] * 1200)}  # over the 1,024-token limit
    for path in ("/v1/decisions", "/v1/systemone"):
        r = ask(
            client,
            {
                "dup": {"type": "set", "labels": ["a", "a"]},
                "long": {"type": "set", "labels": ["short", long_label]},
                "scan": {"type": "span", "labels": [f"l{i}" for i in range(100)]},
                "ok": SET,
            },
            path=path,
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert check("DecisionResponse", body) == []
        answers = body["answers"]
        assert answers["dup"] == {
            "type": "set",
            "error": "invalid_question",
            "message": "labels: the key 'a' appears more than once",
        }
        assert answers["long"]["error"] == "max_length_exceeded" and "label 'long'" in answers["long"]["message"]
        assert "long.short" not in answers  # a set fails whole
        assert answers["scan"]["error"] == "scan_budget_exceeded" and answers["scan"]["type"] == "span"
        assert set(body["sets"]) == {"ok"} and "spans" not in body and body["thresholds"] == {"ok": 0.5}


def test_batches_carry_sets_and_spans_per_state(two_layouts) -> None:
    client, _ = two_layouts
    states = [{"id": 1, "state": "Alice in Paris"}, {"id": "b", "state": "Bob"}]
    r = client.post(
        "/v1/systemone/batches",
        json={
            "model": "tiny-decision-llama",
            "states": states,
            "questions": {"t": SET, "w": {**SPAN, "threshold": 0.0}},
        },
    )
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["id"] for x in results] == [1, "b"]
    assert [[s["text"] for s in x["spans"]["w"]] for x in results] == [["Alice in Paris"] * 2, ["Bob"] * 2]
    assert all(set(x["sets"]["t"]["probabilities"]) == {"travel", "billing"} for x in results)


def test_the_sdk_response_model_reads_set_and_span_answers(two_layouts) -> None:
    typesafe_sdk = pytest.importorskip("typesafe_sdk")
    client, _ = two_layouts
    body = ask(client, {"topics": SET, "who": SPAN}, path="/v1/systemone").json()
    parsed = typesafe_sdk.SystemOneResponse.model_validate(body)
    assert {k: a.noul for k, a in parsed.nouls.items()} == {k: a["noul"] for k, a in body["answers"].items()}
    assert set(parsed.nouls) == {"topics.travel", "topics.billing", "who"}
