"""R-BAT-5 wiring: what the load-time probe finds decides the scheduler's mode and `numerics`."""

from __future__ import annotations

import pytest

from tests.integration.serving import serving
from vllm_srun.adapters.readiness import probe
from vllm_srun.adapters.serving import runtime


@pytest.mark.parametrize("invariant", [True, False])
def test_probe_result_reaches_scheduler_card_and_meta(monkeypatch, encoder_fixture, invariant: bool) -> None:  # type: ignore[no-untyped-def]
    folder = encoder_fixture("embed")  # written (and its golden recorded) before the probe is faked
    seen: list[bool] = []

    def fake_probe(model):  # type: ignore[no-untyped-def]
        seen.append(probe.probe_model(model) is not None)  # the real probe runs on the family's rows
        return invariant

    monkeypatch.setattr(runtime, "probe_model", fake_probe)
    with serving([folder]) as (client, rt):
        served = rt.models["tiny-embed"]
        scheduler = served.scheduler_loop.scheduler
        numerics = "exact" if invariant else "approximate"
        assert seen == [True] and scheduler.batch_invariant is invariant
        assert scheduler.window.window_s == (0.0 if invariant else 0.002)
        assert client.get("/v1/models").json()["data"][0]["numerics"] == numerics
        meta = client.post("/v1/embeddings", json={"input": "x", "options": {"return_meta": True}}).json()["meta"]
        assert meta["numerics"] == numerics
