"""POST /v1/bundle under the hostile-client rules (R-PERF-1 with R-API-9), in-process: its body
is read like every other route's (content encodings, JSON depth and 64-bit integers: 400 before
any forward), each task is held to `max_request_tokens` on its own (413 in its slot, the
others answered), and a large task is prepared off the event loop like a request of its size."""

from __future__ import annotations

import gzip
import json
import threading
from pathlib import Path
from typing import Any

from tests.integration.serving import serving
from tests.integration.test_bundle import forwards
from tests.integration.test_fake_family import fake_container
from vllm_srun.adapters.offload import INLINE_BYTES

QUESTIONS = {"good": {"type": "noul", "instructions": "is it good"}}


def test_a_bundle_body_is_decoded_like_any_other(fake_packages: list[Path]) -> None:
    with serving(fake_container(fake_packages[0], result_cache_entries=0)) as (client, _rt):
        before = forwards(client, "fake-a")
        deep = "[" * 100 + '"x"' + "]" * 100
        raw = json.dumps({"tasks": [{"id": "a", "decisions": {"state": "S", "questions": QUESTIONS}}]})
        r = client.post("/v1/bundle", content=raw.replace('"S"', deep), headers={"content-type": "application/json"})
        assert r.status_code == 400 and "deeper than 64 levels" in r.json()["error"]["message"], r.text
        huge = {"tasks": [{"id": "a", "decisions": {"state": {"n": 2**70}, "questions": QUESTIONS}}]}
        r = client.post("/v1/bundle", content=json.dumps(huge), headers={"content-type": "application/json"})
        assert r.status_code == 400 and "beyond 64 bits" in r.json()["error"]["message"], r.text
        assert forwards(client, "fake-a") == before  # refused whole, before any task ran
        packed = gzip.compress(json.dumps({"tasks": [{"id": "a", "embeddings": {"input": "the cat"}}]}).encode())
        r = client.post(
            "/v1/bundle", content=packed, headers={"content-type": "application/json", "content-encoding": "gzip"}
        )
        assert r.status_code == 200 and r.json()["results"][0]["status"] == 200, r.text


def test_each_task_is_held_to_the_token_budget_alone(encoder_fixture) -> None:  # type: ignore[no-untyped-def]
    with serving([encoder_fixture("embed")], max_request_tokens=40, result_cache_entries=0) as (client, _runtime):
        fits = [{"input": ["one two", "seven"]}, {"input": ["two three", "eight"]}, {"input": ["three four", "four"]}]
        over = {"input": ["one two three four five six seven eight", "eight seven six five four three two one"]}
        tasks = [{"id": str(i), "embeddings": body} for i, body in enumerate(fits)]
        tasks.append({"id": "over", "embeddings": over})
        r = client.post("/v1/bundle", json={"tasks": tasks})
        assert r.status_code == 200, r.text
        got = {x["id"]: x for x in r.json()["results"]}
        used = [got[str(i)]["embeddings"]["usage"]["total_tokens"] for i in range(3)]
        assert all(got[str(i)]["status"] == 200 for i in range(3)) and max(used) <= 40 < sum(used)
        assert got["over"]["status"] == 413 and "max_request_tokens" in got["over"]["error"]["message"]


def test_a_large_task_is_prepared_off_the_event_loop(fake_packages: list[Path]) -> None:
    with serving(fake_container(fake_packages[0], result_cache_entries=0)) as (client, runtime):
        model: Any = runtime.models["fake-a"].model
        threads: dict[int, str] = {}
        tokenize = model.tokenize

        def spy(texts: list[str], *, truncate: bool, max_length: int | None = None) -> Any:
            threads[len(texts)] = threading.current_thread().name
            return tokenize(texts, truncate=truncate, max_length=max_length)

        model.tokenize = spy
        large = ["the cat sat on the mat " * 20] * 60  # one chunk of 60 inputs, well over INLINE_BYTES
        assert len(json.dumps(large)) > INLINE_BYTES
        tasks = [
            {"id": "small", "embeddings": {"input": ["a red bird"]}},
            {"id": "large", "embeddings": {"input": large, "options": {"overflow": "truncate"}}},
        ]
        r = client.post("/v1/bundle", json={"tasks": tasks})
        assert r.status_code == 200 and [x["status"] for x in r.json()["results"]] == [200, 200], r.text
        assert threads[60].startswith("srun-prepare")  # the large task's tokenizing left the loop
        assert not threads[1].startswith("srun-prepare")  # the small one stayed on it
