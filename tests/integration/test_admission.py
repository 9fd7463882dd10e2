"""Admission at the worker in-process (R-ADM-1): a full model answers 429 `overloaded` with
Retry-After before any tokenization, a lone request of any size gets in, a request holds its
rows' counted tokens once they are made (not its body's bytes), and a client that asks again on
the same connection before its Retry-After passed is held until it has."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from tests.fakes import FakeClock, FakeDevice
from tests.integration.serving import serving
from tests.integration.test_fake_family import fake_container
from tests.prometheus_text import metric
from tests.waiting import wait_until
from vllm_srun.domain.scheduling.admission import AdmissionLimits


def test_full_model_429_and_early_retries_are_held(fake_packages: list[Path]) -> None:
    limits = AdmissionLimits(max_queue=1, max_queued_tokens=100)
    clock = FakeClock()  # the app's: when a client's Retry-After has passed
    container = fake_container(fake_packages[0], admission=limits, adapters={"retry_clock": clock.now})
    with serving(container) as (client, rt):
        served = rt.models["fake-a"]
        assert served.admission is not None and served.clock is not None
        huge = {"input": ["the cat " * 10] * 20}  # far over 100 body bytes: alone it gets in
        assert client.post("/v1/embeddings", json=huge).status_code == 200
        held = served.admission.admit(1, 1, served.clock.now())
        try:
            first = client.post("/v1/embeddings", json={"input": "a dog"})
            assert first.status_code == 429 and first.headers["retry-after"] == "1"
            assert first.json()["error"]["code"] == "overloaded" and "--max-queue 1" in first.json()["error"]["message"]
            started = time.monotonic()
            again = client.post("/v1/embeddings", json={"input": "a dog"})  # the same connection, at once
            assert again.status_code == 429 and time.monotonic() - started >= 0.9
        finally:
            served.admission.release(held, served.clock.now(), answered=False)
        clock.advance(float(again.headers["retry-after"]))  # its Retry-After has passed: tried at once
        started = time.monotonic()
        assert client.post("/v1/embeddings", json={"input": "a dog"}).status_code == 200
        assert time.monotonic() - started < 0.9  # not held
        text = client.get("/metrics").text
        assert metric(text, "vllm_srun_unanswered_requests", model="fake-a") == 0
        assert metric(text, "vllm_srun_requests_total", model="fake-a", surface="embeddings", code="overloaded") == 2


@pytest.mark.parametrize("pending_tokens", [60, 100])
def test_the_token_limit_counts_body_bytes_while_something_is_pending(
    fake_packages: list[Path],
    pending_tokens: int,
) -> None:
    limits = AdmissionLimits(max_queue=10, max_queued_tokens=100)
    with serving(fake_container(fake_packages[0], admission=limits)) as (client, rt):
        served = rt.models["fake-a"]
        assert served.admission is not None and served.clock is not None
        held = served.admission.admit(1, pending_tokens, served.clock.now())
        try:
            body = b'{"input": "a dog"}'  # 18 bytes
            r = client.post("/v1/embeddings", content=body, headers={"content-type": "application/json"})
            fits = pending_tokens + len(body) <= 100
            assert r.status_code == (200 if fits else 429)
            if not fits:
                assert "--max-queued-tokens 100" in r.json()["error"]["message"]
        finally:
            served.admission.release(held, served.clock.now(), answered=False)


def test_the_autoscaling_signal_is_unanswered_tokens_over_the_token_limit(fake_packages: list[Path]) -> None:
    """`vllm_srun_queued_work_ratio` (R-OPS-2, what the HPA scales on): 0 when idle, the pending
    tokens' share of --max-queued-tokens while work is held, 0 again once it is answered."""
    limits = AdmissionLimits(max_queue=10, max_queued_tokens=200)
    with serving(fake_container(fake_packages[0], admission=limits)) as (client, rt):
        served = rt.models["fake-a"]
        assert served.admission is not None and served.clock is not None
        assert metric(client.get("/metrics").text, "vllm_srun_queued_work_ratio", model="fake-a") == 0
        held = served.admission.admit(2, 150, served.clock.now())
        try:
            text = client.get("/metrics").text
            assert metric(text, "vllm_srun_queued_work_ratio", model="fake-a") == 0.75
            assert metric(text, "vllm_srun_unanswered_tokens", model="fake-a") == 150
        finally:
            served.admission.release(held, served.clock.now(), answered=True)
        assert metric(client.get("/metrics").text, "vllm_srun_queued_work_ratio", model="fake-a") == 0


def test_a_queued_request_holds_its_rows_tokens_not_its_body_bytes(fake_packages: list[Path]) -> None:
    """Eight bodies of over 100 bytes each (over 800 in all, past the limit of 512 at their bounds)
    all get in while the forwards are held: from its rows on, each holds their counted tokens (42:
    20 words of two tokens and the two special ones)."""
    gate = threading.Event()
    gate.set()  # the load's own forwards run

    def held_forward(tokens: int) -> float:
        assert gate.wait(30), "the test never let the forward finish"
        return 0.0

    limits = AdmissionLimits(max_queue=16, max_queued_tokens=512)
    device = FakeDevice(cost=held_forward)
    text = " ".join(["cats"] * 20)
    body = json.dumps({"input": text}).encode()
    assert len(body) > 100
    with serving(fake_container(fake_packages[0], device=device, admission=limits)) as (client, rt):
        served = rt.models["fake-a"]
        admission = served.admission
        assert admission is not None
        gate.clear()
        codes: list[int] = []

        def post() -> None:
            answer = client.post("/v1/embeddings", content=body, headers={"content-type": "application/json"})
            codes.append(answer.status_code)

        threads = [threading.Thread(target=post) for _ in range(8)]
        try:
            for n, thread in enumerate(threads, 1):
                thread.start()
                wait_until(
                    lambda n=n: admission.pending_requests == n and admission.pending_tokens == n * 42,
                    what=lambda n=n: (
                        f"request {n} admitted with its rows counted ({admission.pending_requests} requests, {admission.pending_tokens} tokens)"
                    ),
                )
            # at their bounds the eight bodies would be past the limit; counted by their rows they are not
            assert admission.pending_tokens == 8 * 42 < 512 < 8 * len(body)
            assert codes == []  # every one still waits on the held forwards
        finally:
            gate.set()
            for thread in threads:
                thread.join(timeout=30)
        assert codes == [200] * 8
        assert admission.pending_requests == 0 and admission.pending_tokens == 0
