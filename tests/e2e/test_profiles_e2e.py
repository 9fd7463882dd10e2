"""Profiles end to end (R-PROF): `vllm-srun serve --profile`, a models file's `profile` and
`options`, and a front config written as upstream writes it (`profile:` on a deployment, the
decision model under `global.model_catalog.system`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from tests.e2e.front import running_front
from tests.e2e.server import running_server

STATE = "the customer wrote that the movie was great fun but the music was boring and the plot was bad " * 2
QUESTIONS = {
    f"q{i}": {"type": "noul", "instructions": text}
    for i, text in enumerate(["is it positive", "is it about music", "is it about a refund", "is it rude"])
}


def decide(base: str, profile: str | None = None, model: str | None = None) -> httpx.Response:
    options: dict[str, Any] = {"return_meta": True} | ({"profile": profile} if profile else {})
    body: dict[str, Any] = {"state": STATE, "questions": QUESTIONS, "options": options}
    return httpx.post(f"{base}/v1/decisions", json=body | ({"model": model} if model else {}), timeout=60)


def test_a_worker_serving_shared_context_from_a_models_file(decision_fixture, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    models = tmp_path / "models.yaml"
    models.write_text(
        f"models:\n  - model: {decision_fixture('llama')}\n    name: judge\n    profile: shared_context\n"
        "    options: {break_even_tokens: 0}\n"
    )
    with running_server("--models", str(models), "--result-cache-entries", "0") as base:
        card = httpx.get(f"{base}/v1/models").json()["data"][0]
        shared, exact, refused = decide(base), decide(base, "exact"), decide(base, "batching")
    assert card["profile"] == "shared_context" and [p["name"] for p in card["profiles"]] == ["exact", "shared_context"]
    assert card["shared_context"]["break_even_source"] == "option"
    assert shared.status_code == 200 and shared.json()["meta"]["rows"] == 1  # the state read once
    assert shared.json()["meta"]["profile"] == "shared_context"
    assert exact.status_code == 200 and exact.json()["meta"]["rows"] == len(QUESTIONS)  # exact never shares
    assert exact.json()["meta"]["profile"] == "exact" and exact.json()["meta"]["numerics"] == "exact"
    assert refused.status_code == 400 and refused.json()["error"]["message"] == (
        "options.profile 'batching' is not enabled for this model (enabled: exact, shared_context)"
    )


def test_the_worker_flag_and_its_default(decision_fixture) -> None:  # type: ignore[no-untyped-def]
    with running_server(str(decision_fixture("llama")), "--result-cache-entries", "0") as base:
        card = httpx.get(f"{base}/v1/models").json()["data"][0]
        exact = decide(base)
    assert card["profile"] == "exact" and card["engine_args"]["enable_shared_context"] is False
    assert exact.json()["meta"]["rows"] == len(QUESTIONS) and exact.json()["meta"]["profile"] == "exact"
    with running_server(
        str(decision_fixture("llama")), "--profile", "max_speed", "--result-cache-entries", "0"
    ) as base:
        card = httpx.get(f"{base}/v1/models").json()["data"][0]
        answer = decide(base, "exact")
    assert card["profile"] == "max_speed" and card["engine_args"]["enable_shared_context"] is True
    assert answer.status_code == 200 and answer.json()["meta"]["profile"] == "exact"


def test_a_front_config_as_upstream_writes_it(encoder_fixture, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    config = tmp_path / "config.yaml"
    config.write_text(
        "global:\n"
        "  router: {enabled: false}\n"
        "  model_catalog:\n"
        "    system:\n"
        "      decision_model: {deployment: embed}\n"
        "    deployments:\n"
        "      embed:\n"
        "        provider: model_runtime\n"
        f"        artifact: {encoder_fixture('embed')}\n"
        "        public_name: acme/tiny-embed\n"
        "        device: cpu\n"
        "        profile: batching\n"
        "        result_cache_entries: 0\n"
    )
    with running_front("--config", str(config)) as front:
        card = httpx.get(f"{front.base}/v1/models").json()["data"][0]
        plain = httpx.post(f"{front.base}/v1/embeddings", json={"model": "acme/tiny-embed", "input": "x"}, timeout=60)
        exact = httpx.post(
            f"{front.base}/v1/embeddings",
            json={"model": "embed", "input": "x", "options": {"profile": "exact", "return_meta": True}},
            timeout=60,
        )
    assert card["profile"] == "batching"
    assert plain.status_code == 200 and plain.json()["model"] == "acme/tiny-embed"  # the published id
    assert exact.status_code == 200 and exact.json()["meta"]["profile"] == "exact"
