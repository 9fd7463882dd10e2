"""Profiles through a worker (R-PROF): what each serves, what a request may ask for, and the one
rule that makes `exact` exact on a model that is not batch-invariant — its rows never share a
forward (R-PROF-2), also on a server whose profile merges everyone else's rows.

The probe is forced to say "not batch-invariant" (as on a host where the load-time check fails),
so the scheduler would merge rows across requests under batching whatever this host's kernels do.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dependency_injector import providers

from tests.integration.serving import container_for, serving
from tests.integration.test_probe_wiring import ForcedProbe
from tests.waiting import wait_until
from vllm_srun.domain.scheduling.planning import ForwardBatch
from vllm_srun.domain.settings.engine_args import EngineArgs
from vllm_srun.domain.worker.worker_settings import ModelSpec

TEXTS = ["the quick brown fox", "a small red bird", "the dog", "blue fish in the green sea of the cat"]


def recorded(runtime: Any, name: str) -> list[ForwardBatch]:
    """Every forward the model runs from now on (its scheduler loop's batches)."""
    loop = runtime.models[name].scheduler_loop
    seen: list[ForwardBatch] = []
    run = loop._run_batch

    def recording(batch: ForwardBatch, payloads: list[Any]) -> Any:
        seen.append(batch)
        return run(batch, payloads)

    loop._run_batch = recording
    return seen


def embed(client: Any, texts: list[str], profile: str | None = None) -> dict[str, Any]:
    options: dict[str, Any] = {"return_meta": True} | ({"profile": profile} if profile else {})
    r = client.post("/v1/embeddings", json={"input": texts, "options": options})
    assert r.status_code == 200, r.text
    return r.json()


def vectors(body: dict[str, Any]) -> list[bytes]:
    return [np.asarray(d["embedding"], dtype=np.float32).tobytes() for d in body["data"]]


@pytest.fixture(scope="module")
def batching_server(encoder_fixture) -> Any:  # type: ignore[no-untyped-def]
    """An embedder served under profile batching, with a long window so concurrent requests meet."""
    args = EngineArgs(profile="batching", batch_window_ms=300)
    container = container_for([(encoder_fixture("embed"), args)], result_cache_entries=0)
    container.readiness.override(providers.Object(ForcedProbe(False)))
    with serving(container) as (client, runtime):
        assert runtime.models["tiny-embed"].ready, runtime.models["tiny-embed"].reason
        yield client, runtime


def test_an_exact_request_on_a_batching_server_runs_its_rows_alone(batching_server) -> None:  # type: ignore[no-untyped-def]
    client, runtime = batching_server
    card = client.get("/v1/models").json()["data"][0]
    assert card["profile"] == "batching" and card["numerics"] == "approximate"
    assert [(p["name"], p["numerics"]) for p in card["profiles"]] == [("exact", "exact"), ("batching", "approximate")]
    alone = [vectors(embed(client, [text], "exact"))[0] for text in TEXTS]  # each input in a request of its own
    seen = recorded(runtime, "tiny-embed")
    answers: dict[str, dict[str, Any]] = {}

    def post(key: str, texts: list[str], profile: str | None) -> None:
        answers[key] = embed(client, texts, profile)

    threads = [
        threading.Thread(target=post, args=("exact", TEXTS, "exact")),
        threading.Thread(target=post, args=("other-1", TEXTS[:2], None)),
        threading.Thread(target=post, args=("other-2", TEXTS[2:], "batching")),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert set(answers) == {"exact", "other-1", "other-2"}
    exact = answers["exact"]
    assert vectors(exact) == alone  # bit for bit the answers each input gets alone
    assert exact["meta"]["profile"] == "exact" and exact["meta"]["numerics"] == "exact"
    assert exact["meta"]["rows"] == len(TEXTS) and exact["meta"]["forwards"] == len(TEXTS)
    for batch in seen:
        if any(row.exact for row in batch.rows):
            assert len(batch.rows) == 1, [(r.request_id, r.exact) for r in batch.rows]
    # not vacuous: the other two requests met in the window and shared a forward
    assert any(len({r.request_id for r in batch.rows}) > 1 for batch in seen), [len(b.rows) for b in seen]
    for key in ("other-1", "other-2"):
        assert answers[key]["meta"]["profile"] == "batching" and answers[key]["meta"]["numerics"] == "approximate"


def test_a_profile_the_model_does_not_serve_is_refused_naming_the_enabled_ones(batching_server) -> None:  # type: ignore[no-untyped-def]
    client, _ = batching_server
    for profile in ("max_speed", "shared_context", "fastest"):
        r = client.post("/v1/embeddings", json={"input": "x", "options": {"profile": profile}})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["code"] == "invalid_request"
        if profile != "fastest":
            assert r.json()["error"]["message"] == (
                f"options.profile '{profile}' is not enabled for this model (enabled: exact, batching)"
            )
    r = client.post("/v1/embeddings", json={"input": "x", "options": {"profile": "Exact!"}})
    assert r.status_code == 400  # not a profile's name at all: the schema refuses it


def test_the_result_cache_keeps_each_profiles_answers_apart(encoder_fixture) -> None:  # type: ignore[no-untyped-def]
    container = container_for([(encoder_fixture("embed"), EngineArgs(profile="batching"))])
    with serving(container) as (client, _):
        body = {"input": ["cache me by profile"], "options": {"return_meta": True}}
        first = client.post("/v1/embeddings", json=body).json()["meta"]
        exact = client.post("/v1/embeddings", json={**body, "options": {"return_meta": True, "profile": "exact"}})
        again = client.post("/v1/embeddings", json={**body, "options": {"return_meta": True, "profile": "batching"}})
        exact_again = client.post("/v1/embeddings", json={**body, "options": {"return_meta": True, "profile": "exact"}})
    assert not first.get("cache_hit") and first["profile"] == "batching"
    assert not exact.json()["meta"].get("cache_hit")  # another profile: another entry
    assert again.json()["meta"].get("cache_hit") is True  # naming the serving profile is the same as not naming it
    assert exact_again.json()["meta"].get("cache_hit") is True and exact_again.json()["meta"]["profile"] == "exact"


@pytest.mark.parametrize(
    ("profile", "dtype", "serves"),
    [
        (None, "auto", "exact"),
        ("exact", "auto", "exact"),
        ("batching", "auto", "batching"),
        ("max_speed", "auto", "max_speed"),
        ("max_speed", "bfloat16", "max_speed"),
        (None, "bfloat16", "max_speed"),  # an unset profile settles as the one another precision needs
        (None, "float32", "exact"),  # a dtype equal to auto's is auto
    ],
)
def test_each_profile_an_encoder_serves(encoder_fixture, profile: str | None, dtype: str, serves: str) -> None:  # type: ignore[no-untyped-def]
    with serving([(encoder_fixture("embed"), EngineArgs(profile=profile, dtype=dtype))]) as (client, runtime):
        served = runtime.models["tiny-embed"]
        assert served.ready, served.reason
        card = client.get("/v1/models").json()["data"][0]
        meta = embed(client, TEXTS[:2])["meta"]
    assert card["profile"] == meta["profile"] == serves
    other_precision = dtype == "bfloat16"  # no exact answer to give: exact is not enabled (R-PROF-4)
    enabled = ["exact"] if serves == "exact" else [serves] if other_precision else ["exact", serves]
    assert [p["name"] for p in card["profiles"]] == enabled
    assert meta["numerics"] == ("exact" if serves == "exact" else card["profiles"][-1]["numerics"]) or (
        serves == "batching" and served.serving.batch_invariant and meta["numerics"] == "exact"
    )
    window = served.scheduler_loop.scheduler.window.window_s
    if serves == "exact" and not served.serving.batch_invariant:
        assert window == 0.0  # every row alone: nothing to wait for
    if serves in ("batching", "max_speed") and not served.serving.batch_invariant:
        assert window == 0.002


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        (
            {"args": EngineArgs(profile="exact", dtype="bfloat16")},
            "profile exact serves the published precision only; another --dtype needs profile max_speed "
            "(the model computes in bfloat16; its published precision is float32)",
        ),
        (
            {"args": EngineArgs(profile="shared_context")},
            "profile shared_context applies to decision models only (a shared-context path); this is an encoder model",
        ),
        ({"options": {"pooling": "cls"}}, "the encoder family has no option 'pooling' (its options: none)"),
        ({"family": "decision"}, "the decision family cannot read this package"),
        ({"family": "nope"}, "family 'nope' is not installed"),
        ({"memory_budget_gib": 1e-6}, "over its memory budget of 1e-06 GiB (memory_budget_gib)"),
    ],
)
def test_what_a_models_file_entry_asks_is_refused_before_the_weights_load(encoder_fixture, spec, reason: str) -> None:  # type: ignore[no-untyped-def]
    folder: Path = encoder_fixture("embed")
    with serving([ModelSpec(str(folder), **spec)]) as (_, runtime):
        served = runtime.models["tiny-embed"]
        wait_until(lambda: served.reason is not None, what="the load's refusal")
    assert not served.ready and reason in (served.reason or ""), served.reason
    assert "\n" not in (served.reason or "")


def test_a_forced_family_that_reads_the_package_and_a_budget_it_fits(encoder_fixture) -> None:  # type: ignore[no-untyped-def]
    spec = ModelSpec(str(encoder_fixture("embed")), family="encoder", memory_budget_gib=1.0)
    with serving([spec]) as (client, runtime):
        assert runtime.models["tiny-embed"].ready, runtime.models["tiny-embed"].reason
        assert client.post("/v1/embeddings", json={"input": "x"}).status_code == 200


def test_a_decision_option_pins_the_break_even(decision_fixture) -> None:  # type: ignore[no-untyped-def]
    spec = ModelSpec(
        str(decision_fixture("llama")), EngineArgs(profile="shared_context"), options={"break_even_tokens": 7}
    )
    with serving([spec]) as (client, runtime):
        card = client.get("/v1/models").json()["data"][0]
    assert card["shared_context"]["break_even_tokens"] == 7 and card["shared_context"]["break_even_source"] == "option"
    bad = ModelSpec(str(decision_fixture("llama")), options={"break_even_tokens": -1})
    with serving([bad]) as (_, runtime):
        (served,) = runtime.models.values()
    assert not served.ready and "options.break_even_tokens must be an integer >= 0 (got -1)" in (served.reason or "")


def test_each_bundle_task_is_answered_under_its_own_profile(batching_server) -> None:  # type: ignore[no-untyped-def]
    client, runtime = batching_server
    seen = recorded(runtime, "tiny-embed")
    body = {
        "tasks": [
            {"id": "exact", "embeddings": {"input": TEXTS[:2], "options": {"profile": "exact", "return_meta": True}}},
            {"id": "served", "embeddings": {"input": TEXTS[2:], "options": {"return_meta": True}}},
            {"id": "bad", "embeddings": {"input": "x", "options": {"profile": "max_speed"}}},
        ]
    }
    r = client.post("/v1/bundle", json=body)
    assert r.status_code == 200, r.text
    results = {t["id"]: t for t in r.json()["results"]}
    assert results["exact"]["status"] == 200 and results["exact"]["embeddings"]["meta"]["profile"] == "exact"
    assert results["served"]["status"] == 200 and results["served"]["embeddings"]["meta"]["profile"] == "batching"
    assert results["bad"]["status"] == 400 and results["bad"]["error"]["code"] == "invalid_request"
    assert all(len(batch.rows) == 1 for batch in seen)  # one exact task keeps the bundle's rows apart
