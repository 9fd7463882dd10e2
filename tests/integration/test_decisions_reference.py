"""A decision answer equals the `transformers` reference model read on the same prompt (R-PKG-2):
our prompt ids, fed to `LlamaForCausalLM` / `Qwen3ForCausalLM`, give the same restricted
next-token probabilities the surface returns (within 1e-4), shared and unshared."""

from __future__ import annotations

import pytest
import torch

from tests.integration.serving import serving
from vllm_srun.adapters.families.decision_rows import AskedQuestion

QUESTIONS = {
    "n": {"type": "noul", "instructions": "is the review positive"},
    "c": {
        "type": "choice",
        "instructions": "what is the tone",
        "criteria": {"positive": None, "negative": "bad", "mixed": None},
    },
    "s": {"type": "score", "instructions": "how good is the movie", "criteria": ["bad", "boring", "good", "great"]},
}
STATE = {"review": "the movie was great fun and the music was good", "stars": [4, 5]}


@pytest.mark.parametrize("variant", ["llama", "qwen3"])
def test_answers_equal_the_transformers_reference(decision_fixture, variant: str) -> None:
    transformers = pytest.importorskip("transformers")
    folder = decision_fixture(variant)
    reference = transformers.AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    with serving([folder], result_cache_entries=0) as (client, rt):
        model = next(iter(rt.models.values())).model
        got = client.post("/v1/systemone", json={"state": STATE, "questions": QUESTIONS}).json()["answers"]
        asked = [AskedQuestion(k, q["type"], q.get("instructions"), q.get("criteria")) for k, q in QUESTIONS.items()]
        prepared = model.prepare(STATE, asked)
    for q in prepared.questions:
        ids = torch.tensor([prepared.state_ids + q.ids])
        with torch.no_grad():
            logits = reference(input_ids=ids).logits[0, -1].double()
        p = torch.softmax(logits[list(q.answer_ids)], -1).tolist()
        answer = got[q.name]
        if q.kind == "noul":
            assert abs(answer["noul"] - p[0]) < 1e-4
        else:
            assert max(abs(a - b) for a, b in zip(answer["probabilities"].values(), p)) < 1e-4
