"""Issue 9, class 4: `/v1/systemone/batches` with an `id` beyond 64 bits ran the forward, then
answered 500. Every field is validated before any row is queued: 400, and no forward."""

from __future__ import annotations

import pytest

from tests.hostile.clients import Server, metric, model_name, post

pytestmark = pytest.mark.slow
QUESTIONS = {"q": {"type": "noul", "instructions": "is it?"}}


@pytest.mark.parametrize("bad", [2**64, -(2**63) - 1, 10**40])
def test_an_id_beyond_64_bits_is_a_400_before_any_forward(target: Server, bad: int) -> None:
    forwards = "vllm_srun_forwards_total"
    before = metric(target, forwards) if target.extra["kind"] == "worker" else None
    body = {"model": model_name(target, "decide"), "states": [{"id": bad, "state": "x"}], "questions": QUESTIONS}
    answer = post(target, "/v1/systemone/batches", body)
    assert answer.status_code == 400, answer.text[:300]
    assert "states[0].id" in answer.json()["error"]["message"]
    if before is not None:
        assert metric(target, forwards) == before


def test_an_integer_beyond_64_bits_anywhere_is_a_400(target: Server) -> None:
    body = {"model": model_name(target, "decide"), "state": {"deep": {"n": 2**70}}, "questions": QUESTIONS}
    answer = post(target, "/v1/decisions", body)
    assert answer.status_code == 400 and "$.state.deep.n" in answer.json()["error"]["message"]
