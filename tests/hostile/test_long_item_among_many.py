"""R-API-10 against real processes: one over-long input among many (or several, or a huge one)
fails in its own slot with `max_length_exceeded`; every other input is answered, each as it is
alone; the over-long input takes no row (the worker's rows counter grows by the others' alone);
and the process keeps answering. Before, one such input failed the whole request."""

from __future__ import annotations

import concurrent.futures

import pytest

from tests.contract_shapes import check
from tests.hostile.clients import Server, metric, model_name, post

pytestmark = pytest.mark.slow

SHORT = [f"short input number {i}" for i in range(64)]
LONG = "a long input " * 300  # ~900 tokens: over the tiny embedder's 128-token limit
HUGE = "x " * 60_000  # one very long text (60,000 tokens): read once, refused in its slot, never run


@pytest.mark.parametrize(
    "bad",
    [{32: LONG}, {0: LONG, 17: LONG, 63: LONG}, {40: HUGE}],
    ids=["one", "several", "huge"],
)
def test_over_long_inputs_fail_in_their_slots_and_the_others_are_answered(target: Server, bad: dict[int, str]) -> None:
    worker = target.extra["kind"] == "worker"
    model = model_name(target, "embed")
    inputs = list(SHORT)
    for at, text in bad.items():
        inputs.insert(at, text)
    before = metric(target, "vllm_srun_rows_total") if worker else None
    answer = post(target, "/v1/embeddings", {"model": model, "input": inputs}, timeout=120)
    assert answer.status_code == 200, answer.text[:300]
    body = answer.json()
    assert check("EmbeddingsResponse", body) == []
    failed = {d["index"] for d in body["data"] if "error" in d}
    assert failed == set(bad)
    for d in body["data"]:
        if d["index"] in bad:
            assert d["error"] == "max_length_exceeded" and "embedding" not in d, d
            assert d["message"].startswith(f"input[{d['index']}] has ")
        else:
            assert len(d["embedding"]) > 0 and d["input"]["truncated"] is False
    if before is not None:
        assert metric(target, "vllm_srun_rows_total") - before == len(SHORT)  # no row for an over-long input
    alone = post(target, "/v1/embeddings", {"model": model, "input": SHORT[:3]}).json()["data"]
    answered = [d for d in body["data"] if d["index"] not in bad]
    assert [d["embedding"] for d in answered[:3]] == [d["embedding"] for d in alone]


def test_a_burst_of_them_leaves_the_others_answered(target: Server) -> None:
    model = model_name(target, "embed")

    def one(n: int) -> tuple[int, list[str | None]]:
        answer = post(target, "/v1/embeddings", {"model": model, "input": [f"fine {n}", LONG, f"also fine {n}"]})
        return answer.status_code, [d.get("error") for d in answer.json().get("data", [])]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(24)))
    assert results == [(200, [None, "max_length_exceeded", None])] * 24
    assert post(target, "/v1/embeddings", {"model": model, "input": "still here"}).status_code == 200
