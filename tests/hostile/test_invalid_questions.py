"""Issue 43: a decision question is read in its own slot, so a client can send 1,024 invalid
questions (unknown types and fields, bad counts, long junk) in every request. Each is answered
`invalid_question` in its slot, or the whole request 400 when none is valid, with a message cut
short; none costs a forward, and a normal client's questions alongside are answered as usual."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.hostile.clients import LivenessProbe, Server, metric, model_name, post

pytestmark = pytest.mark.slow
FORWARDS = "vllm_srun_forwards_total"
NOUL = {"type": "noul", "instructions": "is it about billing?"}


def junk(i: int) -> Any:
    """One invalid question of several kinds."""
    kinds: list[Any] = [
        {"type": f"kind-{i}", "x": "y" * 200},
        {"type": "set", "labels": ["a"], f"field{i}" * 20: 1},
        {"type": "choice", "choices": [{"key": "only"}]},
        {"type": "score", "levels": [str(n) for n in range(50)]},
        {"type": "noul", "instructions": " " * 100},
        {"preset": "pii" * 50},
        "not an object " * 20,
        {"type": "span", "labels": ["a"], "threshold": 9, "over": ["f"] * 3},
    ]
    return kinds[i % len(kinds)]


def attack(model: str, valid: bool = False) -> dict[str, Any]:
    questions = {f"q{i}": junk(i) for i in range(1024 - valid)}
    if valid:
        questions["ok"] = NOUL
    return {"model": model, "state": "I was charged twice.", "questions": questions}


def test_invalid_questions_cost_no_forward(target: Server) -> None:
    model = model_name(target, "decide")
    before = metric(target, FORWARDS) if target.extra["kind"] == "worker" else None
    answer = post(target, "/v1/decisions", attack(model))
    assert answer.status_code == 400, answer.text[:300]
    error = answer.json()["error"]
    assert error["code"] == "invalid_request" and error["message"].startswith("no question is valid (q0: type must be")
    assert len(error["message"]) < 5000 and error["message"].endswith("more)")
    mixed = post(target, "/v1/systemone", attack(model, valid=True))
    assert mixed.status_code == 200, mixed.text[:300]
    answers = mixed.json()["answers"]
    assert len(answers) == 1024 and 0 <= answers["ok"]["noul"] <= 1
    assert all(a["error"] == "invalid_question" and len(a["message"]) <= 300 for k, a in answers.items() if k != "ok")
    if before is not None:
        assert metric(target, FORWARDS) - before <= 1  # the one valid question's row


def test_a_flood_of_invalid_questions_does_not_stop_a_normal_client(target: Server) -> None:
    model = model_name(target, "decide")
    stop = threading.Event()
    normal: list[tuple[int, float]] = []

    def ask_normally() -> None:
        with httpx.Client(base_url=target.base, timeout=60) as client:
            while not stop.is_set():
                start = time.perf_counter()
                r = client.post("/v1/decisions", json={"model": model, "state": "refund", "questions": {"q": NOUL}})
                normal.append((r.status_code, time.perf_counter() - start))
                stop.wait(0.1)

    worker = threading.Thread(target=ask_normally, daemon=True)
    with LivenessProbe(target) as probe:
        worker.start()
        with ThreadPoolExecutor(4) as pool:
            codes = list(pool.map(lambda i: post(target, "/v1/decisions", attack(model)).status_code, range(24)))
        stop.set()
        worker.join(60)
    assert codes == [400] * 24
    assert normal and all(status == 200 for status, _ in normal), normal[:5]
    assert max(seconds for _, seconds in normal) < 10, sorted(s for _, s in normal)[-5:]
    assert not probe.failures and max(probe.latencies) < 5, probe.failures[:5]
