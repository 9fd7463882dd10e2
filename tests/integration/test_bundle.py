"""POST /v1/bundle in-process (R-PERF-1, R-ADM-1): a model's tasks share one submit (and so
forwards), identical rows run once, every answer equals the same call alone, errors stay in
their slot, and the bundle itself fails only as 400 (malformed) or 413 (too many tasks)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.serving import serving
from tests.integration.test_fake_family import fake_container
from tests.prometheus_text import metric
from vllm_srun.domain.scheduling.admission import AdmissionLimits

QUESTIONS = {
    "good": {"type": "noul", "instructions": "is it good"},
    "team": {"type": "choice", "criteria": {"billing": None, "shipping": None}},
}
TASKS: list[tuple[str, str, dict[str, Any]]] = [
    ("vec", "embeddings", {"input": ["the cat", "a red bird"]}),
    ("label", "classify", {"input": ["help please", "the order"]}),
    ("rank", "rerank", {"query": "capital", "documents": ["paris", "dog", "blue"]}),
    ("ask", "decisions", {"state": "the movie was fun", "questions": QUESTIONS}),
]
PATHS = {
    "embeddings": "/v1/embeddings",
    "classify": "/v1/classify",
    "rerank": "/v1/rerank",
    "decisions": "/v1/decisions",
}


def two_models(packages: list[Path], **settings: Any) -> Any:
    return fake_container(packages, result_cache_entries=0, **settings)


def forwards(client: Any, model: str) -> float:
    text = client.get("/metrics").text
    return sum(
        metric(text, "vllm_srun_forwards_total", model=model, lane=lane, outcome="ok") for lane in ("text", "shared")
    )


def rows_run(client: Any, model: str) -> float:
    text = client.get("/metrics").text
    return sum(metric(text, "vllm_srun_rows_total", model=model, lane=lane) for lane in ("text", "shared"))


def comparable(surface: str, answer: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in answer.items() if not (surface == "rerank" and k == "id")}


def test_one_bundle_answers_like_four_calls_in_fewer_forwards(fake_packages: list[Path]) -> None:
    with serving(two_models(fake_packages)) as (client, _rt):
        alone = {}
        before = forwards(client, "fake-a")
        for task_id, surface, body in TASKS:
            r = client.post(PATHS[surface], json={**body, "model": "fake-a"})
            assert r.status_code == 200, r.text
            alone[task_id] = r.json()
        four_calls = forwards(client, "fake-a") - before

        before = forwards(client, "fake-a")
        tasks = [{"id": i, s: {**b, "model": "fake-a"}} for i, s, b in TASKS]
        r = client.post("/v1/bundle", json={"tasks": tasks})
        assert r.status_code == 200, r.text
        one_bundle = forwards(client, "fake-a") - before
        results = r.json()["results"]
        assert [x["id"] for x in results] == [t[0] for t in TASKS] and {x["status"] for x in results} == {200}
        for (task_id, surface, _), result in zip(TASKS, results):
            assert comparable(surface, result[surface]) == comparable(surface, alone[task_id]), surface
        # the four calls ran at least one forward each; the bundle one per lane it used
        assert four_calls >= 4 and one_bundle <= 2


def test_identical_rows_run_once(fake_packages: list[Path]) -> None:
    with serving(two_models(fake_packages)) as (client, _rt):
        before = rows_run(client, "fake-a")
        tasks = [
            {"id": "1", "embeddings": {"input": ["the cat", "a dog"], "model": "fake-a"}},
            {"id": "2", "embeddings": {"input": ["a dog", "the cat", "the cat"], "model": "fake-a"}},
            {"id": "3", "classify": {"input": ["the cat"], "model": "fake-a"}},  # same ids, another payload kind
        ]
        r = client.post("/v1/bundle", json={"tasks": tasks})
        assert r.status_code == 200, r.text
        assert rows_run(client, "fake-a") - before == 3  # "the cat", "a dog" once each; the classify row
        first, second = (res["embeddings"]["data"] for res in r.json()["results"][:2])
        assert second[0]["embedding"] == first[1]["embedding"] and second[1]["embedding"] == first[0]["embedding"]
        assert second[2]["embedding"] == first[0]["embedding"]


def test_units_per_model_and_errors_in_their_slot(fake_packages: list[Path]) -> None:
    with serving(two_models(fake_packages)) as (client, _rt):
        tasks = [
            {"id": "a", "embeddings": {"input": "the cat", "model": "fake-a"}},
            {"id": "b", "embeddings": {"input": "the cat", "model": "fake-b"}},
            {"id": "missing", "classify": {"input": "x", "model": "nope"}},
            {"id": "long", "embeddings": {"input": "the cat " * 200, "model": "fake-a"}},
            {"id": "unnamed", "rerank": {"query": "q", "documents": ["d"]}},  # two models served
            {
                "id": "box",
                "decisions": {
                    "state": "s",
                    "questions": {"b": {"type": "box"}, "n": {"type": "noul", "instructions": "ok?"}},
                    "model": "fake-b",
                },
            },
            {"id": "boxes", "decisions": {"state": "s", "questions": {"b": {"type": "box"}}, "model": "fake-b"}},
        ]
        r = client.post("/v1/bundle", json={"tasks": tasks, "options": {"deadline_ms": 30000}})
        assert r.status_code == 200, r.text
        got = {x["id"]: x for x in r.json()["results"]}
        assert list(got) == [t["id"] for t in tasks]
        assert got["a"]["status"] == 200 and got["a"]["embeddings"]["model"] == "fake-a"
        assert got["b"]["status"] == 200 and got["b"]["embeddings"]["model"] == "fake-b"
        assert got["missing"]["status"] == 404 and got["missing"]["error"]["code"] == "model_not_found"
        (long,) = got["long"]["embeddings"]["data"]  # an item's failure stays in its slot (R-API-10)
        assert got["long"]["status"] == 200 and long["error"] == "max_length_exceeded"
        assert "over the limit of" in long["message"] and "embedding" not in long
        assert got["unnamed"]["status"] == 400 and "several models" in got["unnamed"]["error"]["message"]
        box = got["box"]["decisions"]["answers"]["b"]  # a question error stays in its own slot
        assert got["box"]["status"] == 200 and box["error"] == "invalid_question" and box["type"] == "box"
        assert got["boxes"]["status"] == 400 and "no question is valid" in got["boxes"]["error"]["message"]


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        ({"tasks": []}, 400, "tasks"),
        ({"tasks": [{"id": "x"}]}, 400, "exactly one of"),
        ({"tasks": [{"id": "x", "embeddings": {"input": "a"}, "classify": {"input": "a"}}]}, 400, "exactly one of"),
        (
            {"tasks": [{"id": "x", "embeddings": {"input": "a"}}, {"id": "x", "embeddings": {"input": "b"}}]},
            400,
            "unique",
        ),
        ({"tasks": [{"id": "x", "embeddings": {"input": "a"}, "colour": 1}]}, 400, "colour"),
        ({"tasks": [{"embeddings": {"input": "a"}}]}, 400, "id"),
        ({"tasks": {"id": "x", "embeddings": {"input": "a"}}}, 400, "tasks"),
        ([{"id": "x", "embeddings": {"input": "a"}}], 400, "object"),
        ({"tasks": [{"id": str(i), "embeddings": {"input": "a"}} for i in range(5)]}, 413, "--max-bundle-tasks"),
    ],
)
def test_a_bundle_fails_whole_only_when_malformed_or_too_large(
    fake_packages: list[Path], body: dict[str, Any], status: int, says: str
) -> None:
    with serving(fake_container(fake_packages[0], max_bundle_tasks=4)) as (client, _rt):
        before = forwards(client, "fake-a")
        r = client.post("/v1/bundle", json=body)
        assert r.status_code == status and says in r.json()["error"]["message"], r.text
        assert forwards(client, "fake-a") == before  # a refused bundle costs no forward


BAD_BODIES = [
    ("empty", "embeddings", {"input": []}, "length >= 1"),
    ("colour", "embeddings", {"input": "a", "colour": 1}, "colour"),
    ("typed", "classify", {"input": 5}, "$.input"),
    ("notabody", "rerank", "documents", "object"),
    ("noquestions", "decisions", {"state": "s"}, "questions"),
]


def test_a_task_whose_body_is_refused_gets_its_error_in_its_slot(fake_packages: list[Path]) -> None:
    with serving(fake_container(fake_packages[0], result_cache_entries=0)) as (client, _rt):
        alone = client.post("/v1/embeddings", json={"input": []})  # what the bad task gets as a call
        assert alone.status_code == 400, alone.text
        before, rows_before = forwards(client, "fake-a"), rows_run(client, "fake-a")
        bad = [{"id": i, s: b} for i, s, b, _ in BAD_BODIES]
        r = client.post("/v1/bundle", json={"tasks": bad})
        assert r.status_code == 200, r.text
        got = {x["id"]: x for x in r.json()["results"]}
        assert list(got) == [t[0] for t in BAD_BODIES]
        for index, (task_id, surface, _, says) in enumerate(BAD_BODIES):
            error = got[task_id]["error"]
            assert got[task_id]["status"] == 400 and error["code"] == "invalid_request", got[task_id]
            assert says in error["message"] and error["message"].startswith(f"tasks[{index}].{surface}: ")
            assert "\n" not in error["message"] and surface not in {k for k in got[task_id] if k != "id"}
        assert got["empty"]["error"]["message"].endswith(alone.json()["error"]["message"])
        assert forwards(client, "fake-a") == before and rows_run(client, "fake-a") == rows_before  # no forward

        good = {"id": "ok", "embeddings": {"input": ["the cat"]}}
        r = client.post("/v1/bundle", json={"tasks": [bad[0], good, bad[2]]})
        assert r.status_code == 200, r.text
        statuses = [(x["id"], x["status"]) for x in r.json()["results"]]
        assert statuses == [("empty", 400), ("ok", 200), ("typed", 400)]
        assert r.json()["results"][1]["embeddings"]["data"][0]["embedding"]
        assert rows_run(client, "fake-a") == rows_before + 1  # the good task's row alone ran


def test_a_models_tasks_are_admitted_together_or_not_at_all(fake_packages: list[Path]) -> None:
    limits = AdmissionLimits(max_queue=2, max_queued_tokens=1 << 20)
    with serving(two_models(fake_packages, admission=limits)) as (client, rt):
        served = rt.models["fake-a"]
        assert served.admission is not None and served.clock is not None
        held = served.admission.admit(1, 10, served.clock.now())  # one request of fake-a is pending
        try:
            tasks = [
                {"id": "1", "embeddings": {"input": "a", "model": "fake-a"}},
                {"id": "2", "classify": {"input": "b", "model": "fake-a"}},
                {"id": "3", "embeddings": {"input": "c", "model": "fake-b"}},
            ]
            r = client.post("/v1/bundle", json={"tasks": tasks})
            got = r.json()["results"]
            assert [x["status"] for x in got] == [429, 429, 200]  # 1 + 2 > 2: neither of fake-a's gets in
            assert "--max-queue 2" in got[0]["error"]["message"]
            one = client.post("/v1/embeddings", json={"input": "a", "model": "fake-a"})
            assert one.status_code == 200  # 1 + 1 fits
            assert served.admission.pending_requests == 1
        finally:
            served.admission.release(held, served.clock.now(), answered=False)
        assert client.post("/v1/bundle", json={"tasks": tasks}).json()["results"][0]["status"] == 200


def test_the_bundle_is_in_the_openapi_document(fake_packages: list[Path]) -> None:
    with serving(fake_container(fake_packages[0])) as (client, _rt):
        doc = client.get("/openapi.json").json()
        assert "/v1/bundle" in doc["paths"]
        task = doc["components"]["schemas"]["BundleTask"]["properties"]
        assert set(task) == {"id", "embeddings", "classify", "rerank", "decisions"}
