"""`--deterministic` against real processes: every answer is bit-identical to the same input served
alone, whatever the concurrent mix it arrives in (hypothesis draws the mixes), for an encoder
(MiniLM: batch-invariant packed kernels, rows still merge) and a decision model (a tiny fixture:
one row per forward). Result caches are off, so every answer is computed."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.e2e.server import running_server

pytestmark = pytest.mark.slow
WORDS = [
    "the",
    "of",
    "billing",
    "refund",
    "late",
    "order",
    "crash",
    "login",
    "weather",
    "flight",
    "hotel",
    "review",
    "urgent",
    "human",
    "agent",
    "plan",
]
TEXT = st.lists(st.sampled_from(WORDS), min_size=1, max_size=60).map(" ".join)
RUNS = settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def minilm_deterministic(minilm_dir) -> Iterator[str]:  # type: ignore[no-untyped-def]
    with running_server("--deterministic", "--result-cache-entries", "0") as base:
        yield base


@pytest.fixture(scope="module")
def decision_deterministic(decision_fixture) -> Iterator[str]:  # type: ignore[no-untyped-def]
    with running_server(str(decision_fixture("llama")), "--deterministic", "--result-cache-entries", "0") as base:
        yield base


async def _post_all(base: str, path: str, bodies: list[dict]) -> list[dict]:
    async with httpx.AsyncClient(base_url=base, timeout=120) as client:
        answers = await asyncio.gather(*(client.post(path, json=b) for b in bodies))
    assert all(r.status_code == 200 for r in answers), [r.text for r in answers if r.status_code != 200]
    return [r.json() for r in answers]


def _vectors(answer: dict) -> list[bytes]:
    return [base64.b64decode(d["embedding"]) for d in answer["data"]]


def test_cards_say_deterministic_and_how(minilm_deterministic: str, decision_deterministic: str) -> None:
    minilm = httpx.get(f"{minilm_deterministic}/v1/models").json()["data"][0]
    decision = httpx.get(f"{decision_deterministic}/v1/models").json()["data"][0]
    assert minilm["numerics"] == "deterministic" and minilm["deterministic"] == {"method": "batch_invariant"}
    assert minilm["kernels"]["linear"] == "onednn_packed" and minilm["golden"]["status"] == "matched"
    # on a CPU in FP32 the decision model runs on the packed decoder engine: batch-invariant, rows merge
    assert decision["numerics"] == "deterministic" and decision["deterministic"] == {"method": "batch_invariant"}
    assert decision["kernels"]["linear"] == "onednn_packed"
    assert decision["engine_args"]["max_num_seqs"] > 1 and decision["engine_args"]["max_num_seqs_source"] != (
        "deterministic"
    )
    assert decision["shared_context"]["break_even_source"] == "deterministic"
    meta = httpx.post(
        f"{minilm_deterministic}/v1/embeddings", json={"input": "x", "options": {"return_meta": True}}
    ).json()["meta"]
    assert meta["numerics"] == "deterministic"


@RUNS
@given(mix=st.lists(st.lists(TEXT, min_size=1, max_size=4), min_size=2, max_size=16))
def test_minilm_answers_in_any_concurrent_mix_equal_each_input_alone(minilm_deterministic: str, mix) -> None:  # type: ignore[no-untyped-def]
    bodies = [{"input": texts, "encoding_format": "base64"} for texts in mix]
    mixed = asyncio.run(_post_all(minilm_deterministic, "/v1/embeddings", bodies))
    alone_texts = sorted({t for texts in mix for t in texts})
    alone = {}
    for text in alone_texts:  # one at a time: each runs in a forward of its own
        (answer,) = asyncio.run(
            _post_all(minilm_deterministic, "/v1/embeddings", [{"input": text, "encoding_format": "base64"}])
        )
        alone[text] = _vectors(answer)[0]
    for texts, answer in zip(mix, mixed):
        assert _vectors(answer) == [alone[t] for t in texts]


def _decision_body(state: str, questions: list[str]) -> dict:
    return {
        "state": state,
        "questions": {f"q{i}": {"type": "noul", "instructions": q} for i, q in enumerate(questions)},
    }


@RUNS
@given(mix=st.lists(st.tuples(TEXT, st.lists(st.sampled_from(WORDS), min_size=1, max_size=3)), min_size=2, max_size=8))
def test_decision_answers_in_any_concurrent_mix_equal_each_request_alone(decision_deterministic: str, mix) -> None:  # type: ignore[no-untyped-def]
    bodies = [_decision_body(state, questions) for state, questions in mix]
    mixed = asyncio.run(_post_all(decision_deterministic, "/v1/decisions", bodies))
    for body, answer in zip(bodies, mixed):
        (alone,) = asyncio.run(_post_all(decision_deterministic, "/v1/decisions", [body]))
        # JSON floats round-trip exactly (shortest repr), so equal text is equal bits
        assert json.dumps(answer["answers"], sort_keys=True) == json.dumps(alone["answers"], sort_keys=True)
