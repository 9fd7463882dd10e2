"""Shared context through the serving path (R-SC-1): a request's state runs once and every question
branches from it; the answers equal the unshared ones within 1e-4 for 1, 2, 16 and 128 questions,
and question order changes no answer. Sharing is profile shared_context's (R-PROF-1): the default
profile, exact, never shares, and a request on a sharing model may ask for exact."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.serving import serving
from tests.prometheus_text import metric
from vllm_srun.domain.settings.engine_args import EngineArgs

TOL = 1e-4
STATE = (
    "the customer wrote that the movie was great fun but the music was boring and the plot was bad; "
    "they were charged twice for the order and want a refund today, please help "
) * 3


def questions(n: int) -> dict[str, Any]:
    """N questions of all three types and of different lengths."""
    out: dict[str, Any] = {}
    words = ["is", "the", "review", "positive", "about", "the", "movie", "and", "the", "music", "today"]
    for i in range(n):
        text = " ".join(words[: 3 + i % 9])
        kind = ("noul", "choice", "score")[i % 3]
        if kind == "noul":
            out[f"q{i}"] = {"type": "noul", "instructions": text}
        elif kind == "choice":
            out[f"q{i}"] = {
                "type": "choice",
                "instructions": text,
                "criteria": {"positive": None, "negative": "a bad review", "mixed": None, "neutral": None},
            }
        else:
            out[f"q{i}"] = {
                "type": "score",
                "instructions": text,
                "criteria": ["bad", "boring", "good", "great"][: 2 + i % 3],
            }
    return out


def numbers(answers: dict[str, Any]) -> dict[str, float]:
    """Every number of every answer, by path."""
    flat: dict[str, float] = {}
    for name, a in answers.items():
        assert "error" not in a, a
        for key in ("noul", "score", "confidence"):
            if key in a:
                flat[f"{name}.{key}"] = a[key]
        for label, p in (a.get("probabilities") or {}).items():
            flat[f"{name}.p[{label}]"] = p
    return flat


def assert_close(a: dict[str, Any], b: dict[str, Any], tol: float = TOL) -> float:
    fa, fb = numbers(a), numbers(b)
    assert fa.keys() == fb.keys()
    worst = max(abs(fa[k] - fb[k]) for k in fa)
    assert worst <= tol, worst
    for name in a:  # the chosen option is the same (probabilities this close never swap the argmax here)
        assert a[name].get("choice") == b[name].get("choice")
    return worst


@pytest.fixture(scope="module")
def two_layouts(decision_fixture, tmp_path_factory) -> Iterator[tuple[Any, Any]]:
    """The same package served twice: always shared (profile shared_context, break-even pinned to 0),
    and never shared (`--no-enable-shared-context`: profile exact)."""
    base = decision_fixture("llama")
    shared = tmp_path_factory.mktemp("shared") / "tiny-decision-shared"
    shutil.copytree(base, shared)
    manifest = json.loads((shared / "srun.json").read_text())
    manifest["shared_context"] = {"break_even_tokens": 0}
    (shared / "srun.json").write_text(json.dumps(manifest))
    models = [
        (shared, EngineArgs(batch_window_ms=0, profile="shared_context")),
        (base, EngineArgs(batch_window_ms=0, enable_shared_context=False)),
    ]
    with serving(models, result_cache_entries=0) as (client, runtime):
        assert all(m.ready for m in runtime.models.values()), {n: m.reason for n, m in runtime.models.items()}
        yield client, runtime


def ask(client: Any, model: str, qs: dict[str, Any], profile: str | None = None) -> dict[str, Any]:
    options: dict[str, Any] = {"return_meta": True} | ({"profile": profile} if profile else {})
    r = client.post("/v1/decisions", json={"model": model, "state": STATE, "questions": qs, "options": options})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("n", [1, 2, 16, 128])
def test_shared_answers_equal_unshared(two_layouts, n: int) -> None:
    client, _runtime = two_layouts
    qs = questions(n)
    shared = ask(client, "tiny-decision-shared", qs)
    alone = ask(client, "tiny-decision-llama", qs)
    assert shared["meta"]["rows"] == 1 and alone["meta"]["rows"] == n  # one shared row vs one row per question
    assert list(shared["answers"]) == list(qs)
    assert_close(shared["answers"], alone["answers"])
    assert shared["usage"] == alone["usage"]  # the state counted once in both layouts
    card = next(c for c in client.get("/v1/models").json()["data"] if c["id"] == "tiny-decision-shared")
    assert (
        card["shared_context"]["break_even_tokens"] == 0 and card["shared_context"]["break_even_source"] == "manifest"
    )


@pytest.mark.parametrize("model", ["tiny-decision-shared", "tiny-decision-llama"])
def test_question_order_changes_no_answer(two_layouts, model: str) -> None:
    client, _ = two_layouts
    qs = questions(16)
    forward = ask(client, model, qs)["answers"]
    backward = ask(client, model, dict(reversed(list(qs.items()))))["answers"]
    assert list(backward) == list(reversed(list(qs)))
    assert_close(forward, {k: backward[k] for k in forward})


def test_usage_counts_the_state_once(two_layouts) -> None:
    client, runtime = two_layouts
    model = runtime.models["tiny-decision-shared"].model
    qs = questions(5)
    prepared = model.prepare(STATE, [])
    state_tokens = len(prepared.state_ids)
    body = ask(client, "tiny-decision-shared", qs)
    one = ask(client, "tiny-decision-shared", {"q0": qs["q0"]})["usage"]["input_tokens"] - state_tokens
    assert body["usage"]["output_tokens"] == 0
    assert state_tokens < body["usage"]["input_tokens"] < 5 * state_tokens
    assert one > 0


@pytest.mark.parametrize("n", [2, 16])
def test_a_request_for_exact_on_a_sharing_model_is_not_shared(two_layouts, n: int) -> None:
    client, _ = two_layouts
    qs = questions(n)
    exact = ask(client, "tiny-decision-shared", qs, profile="exact")
    alone = ask(client, "tiny-decision-llama", qs)
    assert exact["meta"]["rows"] == n and exact["meta"]["profile"] == "exact" and exact["meta"]["numerics"] == "exact"
    assert exact["answers"] == alone["answers"]  # bit for bit: the same weights, every row alone
    shared = ask(client, "tiny-decision-shared", qs)
    assert shared["meta"]["rows"] == 1 and shared["meta"]["profile"] == "shared_context"
    assert shared["meta"]["numerics"] == "approximate"
    refused = client.post(
        "/v1/decisions",
        json={
            "model": "tiny-decision-llama",
            "state": STATE,
            "questions": qs,
            "options": {"profile": "shared_context"},
        },
    )
    assert refused.status_code == 400 and refused.json()["error"] == {
        "code": "invalid_request",
        "message": "options.profile 'shared_context' is not enabled for this model (enabled: exact)",
    }


def test_shared_rows_run_in_the_shared_lane(two_layouts) -> None:
    client, _ = two_layouts
    before = metric(client.get("/metrics").text, "vllm_srun_rows_total", model="tiny-decision-shared", lane="shared")
    ask(client, "tiny-decision-shared", questions(3))
    after = metric(client.get("/metrics").text, "vllm_srun_rows_total", model="tiny-decision-shared", lane="shared")
    assert after == before + 1


def test_no_enable_shared_context_is_reported(two_layouts) -> None:
    client, _ = two_layouts
    cards = {c["id"]: c for c in client.get("/v1/models").json()["data"]}
    assert cards["tiny-decision-llama"]["engine_args"]["enable_shared_context"] is False
    assert cards["tiny-decision-shared"]["engine_args"]["enable_shared_context"] is True
    assert cards["tiny-decision-llama"]["shared_context"]["enabled"] is False
    assert cards["tiny-decision-llama"]["profile"] == "exact"  # the flag off is profile exact
    assert cards["tiny-decision-shared"]["profile"] == "shared_context"
    assert [p["name"] for p in cards["tiny-decision-shared"]["profiles"]] == ["exact", "shared_context"]


def test_break_even_is_measured_at_load(decision_fixture) -> None:
    with serving([(Path(decision_fixture("llama")), EngineArgs(profile="shared_context"))]) as (client, _):
        card = client.get("/v1/models").json()["data"][0]
    sc = card["shared_context"]
    assert sc["enabled"] is True and sc["break_even_source"] == "measured" and sc["break_even_tokens"] >= 0
    assert card["engine_args"]["enable_shared_context"] is True and card["dtype"] == "float32"  # BF16 published, CPU


def test_the_default_profile_never_shares_and_measures_nothing(decision_fixture) -> None:
    with serving([Path(decision_fixture("llama"))], result_cache_entries=0) as (client, runtime):
        card = client.get("/v1/models").json()["data"][0]
        body = ask(client, card["id"], questions(4))
        invariant = runtime.models[card["id"]].scheduler_loop.scheduler.batch_invariant
    assert card["profile"] == "exact" and [p["name"] for p in card["profiles"]] == ["exact"]
    assert card["shared_context"]["enabled"] is False and card["shared_context"]["break_even_source"] is None
    # on a CPU in FP32 the packed decoder engine is batch-invariant (the probe agrees): exact merges
    # the questions' rows (R-PROF-2; within R-BAT-5's 512 tokens a forward), packed, not padded
    assert invariant is True and card["kernels"]["linear"] == "onednn_packed"
    assert [cap["accounting"] for cap in card["caps"]] == ["packed", "packed"]
    assert body["meta"]["rows"] == 4 and body["meta"]["forwards"] < 4 and body["meta"]["numerics"] == "exact"
