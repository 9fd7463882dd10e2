"""R-BAT-5 wiring: what the load-time probe finds decides the scheduler's mode and `numerics`
(under profile batching, where a model that is not batch-invariant merges rows in a window; under
exact its rows run alone, R-PROF-2, and its answers are exact whatever the probe found).

The probe is one of the container's providers: the test overrides it with one that runs the real
probe (to show the family offers probe rows) and then reports the answer the test wants."""

from __future__ import annotations

from typing import Any

import pytest
from dependency_injector import providers

from tests.integration.serving import container_for, serving
from vllm_srun.adapters.contracts import LoadedModel
from vllm_srun.adapters.readiness.golden import LoadTimeChecks
from vllm_srun.adapters.readiness.probe import probe_model
from vllm_srun.domain.settings.engine_args import EngineArgs


class ForcedProbe(LoadTimeChecks):
    def __init__(self, answer: bool) -> None:
        super().__init__(check_golden=True)
        self.answer = answer
        self.seen: list[bool] = []

    def probe(self, model: LoadedModel) -> bool | None:
        self.seen.append(probe_model(model) is not None)  # the real probe runs on the family's rows
        return self.answer


@pytest.mark.parametrize("profile", ["batching", "exact"])
@pytest.mark.parametrize("invariant", [True, False])
def test_probe_result_reaches_scheduler_card_and_meta(encoder_fixture: Any, invariant: bool, profile: str) -> None:
    container = container_for([(encoder_fixture("embed"), EngineArgs(profile=profile))])
    checks = ForcedProbe(invariant)
    container.readiness.override(providers.Object(checks))
    with serving(container) as (client, rt):
        served = rt.models["tiny-embed"]
        assert served.scheduler_loop is not None
        scheduler = served.scheduler_loop.scheduler
        numerics = "exact" if invariant else "approximate"
        assert checks.seen == [True] and scheduler.batch_invariant is invariant
        alone = profile == "exact" and not invariant  # its rows never wait for company (R-PROF-2)
        assert scheduler.window.window_s == (0.0 if invariant or alone else 0.002)
        assert client.get("/v1/models").json()["data"][0]["numerics"] == numerics
        meta = client.post("/v1/embeddings", json={"input": "x", "options": {"return_meta": True}}).json()["meta"]
        assert meta["numerics"] == ("exact" if profile == "exact" else numerics) and meta["profile"] == profile
