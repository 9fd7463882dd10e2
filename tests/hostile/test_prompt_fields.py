"""Issue 20: `/v1/embeddings` takes `input_type` and `prompt_name`. A client that names a prompt
the model does not have, asks for a prompt type from a model without prompts, or sends a huge
prompt name gets a 400 before any row is queued (no forward), with the name echoed cut short."""

from __future__ import annotations

import pytest

from tests.hostile.clients import Server, metric, model_name, post

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"prompt_name": "nope"}, "prompt_name 'nope' is not a prompt of this model (this model has no prompts)"),
        ({"input_type": "query"}, "input_type 'query' needs a model with prompts"),
        ({"prompt_name": "x" * 200}, "characters)"),
        ({"prompt_name": "x" * 100_000}, "length"),
        ({"input_type": "passage"}, "input_type"),
    ],
)
def test_a_bad_prompt_choice_is_a_400_before_any_forward(target: Server, extra: dict, needle: str) -> None:
    forwards = "vllm_srun_forwards_total"
    before = metric(target, forwards) if target.extra["kind"] == "worker" else None
    body = {"model": model_name(target, "embed"), "input": ["one", "two"], **extra}
    answer = post(target, "/v1/embeddings", body)
    assert answer.status_code == 400, answer.text[:300]
    message = answer.json()["error"]["message"]
    assert needle in message and len(message) < 400, message[:500]
    if before is not None:
        assert metric(target, forwards) == before
