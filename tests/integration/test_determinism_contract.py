"""`--deterministic` through the engine contract, with the fake family (no torch): the engine's
declared `Determinism` decides the method the card shows, and a value the contract does not know
fails the load in one line instead of serving unpredictably."""

from __future__ import annotations

from pathlib import Path

import pytest
from dependency_injector import providers

from tests.fake_family import FakeEnginePlugin, FakeFamily, FakeForward
from tests.fakes import FakeDevice
from tests.integration.serving import container_for, serving
from tests.integration.test_fake_family import FAKE_ENGINE, FAKE_FAMILY
from tests.integration.test_fake_family import fake_package as fake_package  # the module fixture
from vllm_srun.adapters.contracts import EngineRequest, Progress
from vllm_srun.adapters.engines.registry import EngineRegistry
from vllm_srun.adapters.families.registry import FamilyRegistry


class DeclaringPlugin(FakeEnginePlugin):
    """The fake engine, declaring DETERMINISM instead of its own."""

    def __init__(self, determinism: str | None) -> None:
        self.determinism = determinism

    def build(self, request: EngineRequest, progress: Progress) -> FakeForward:
        engine = super().build(request, progress)
        engine.determinism = self.determinism  # the instance's own declaration
        return engine


def deterministic_card(package: Path, determinism: str | None) -> dict:
    container = container_for([package], deterministic=True)
    container.families.override(providers.Object(FamilyRegistry(families={"fake": (FAKE_FAMILY, FakeFamily())})))
    engines = EngineRegistry(engines={"fake": (FAKE_ENGINE, DeclaringPlugin(determinism))})
    container.engines.override(providers.Object(engines))
    container.device.override(providers.Object(FakeDevice()))
    with serving(container) as (client, _rt):
        return client.get("/v1/models").json()["data"][0]


@pytest.mark.parametrize("declared", ["batch_invariant", "rows_alone"])
def test_the_declared_method_is_the_cards(fake_package: Path, declared: str) -> None:
    card = deterministic_card(fake_package, declared)
    assert card["status"] == "ready" and card["numerics"] == "deterministic"
    assert card["deterministic"] == {"method": declared}


def test_an_engine_that_cannot_or_declares_an_unknown_method_fails_the_load(fake_package: Path) -> None:
    refused = deterministic_card(fake_package, None)
    assert refused["status"] == "failed" and "cannot answer bit-identically in any batch" in refused["reason"]
    unknown = deterministic_card(fake_package, "mostly")
    assert unknown["status"] == "failed"
    assert "declares determinism 'mostly' (known: batch_invariant, rows_alone)" in unknown["reason"]
