"""Load retries (R-LOAD-1) through the real runtime, with the fake family (no torch) made flaky:
a transient failure (an I/O error, a package still being written) is tried again after its
wait while `/health` and the card say which attempt failed and when the next starts; a final one
(the package, a capability) ends the model at once; the attempts run out into one reason."""

from __future__ import annotations

import errno
import time
from pathlib import Path
from typing import Any

import pytest

from tests.fake_family import FakeEnginePlugin, FakeFamily
from tests.fakes import FakeDevice
from tests.integration.serving import container_for, serving
from tests.integration.test_fake_family import FAKE_ENGINE, FAKE_FAMILY
from tests.stores import session_store
from vllm_srun.adapters.contracts import LoadContext, LoadedModel
from vllm_srun.adapters.engines.registry import EngineRegistry
from vllm_srun.adapters.families.registry import FamilyRegistry
from vllm_srun.app.fixtures import write_fixture


class FlakyFamily(FakeFamily):
    """The fake family, whose first FAILS loads raise what MAKE_ERROR gives (after TOUCHING a file
    of the package, when asked: a copy still being written)."""

    def __init__(self, fails: int, make_error: Any, touching: bool = False) -> None:
        self.fails = fails
        self.make_error = make_error
        self.touching = touching
        self.loads = 0

    def load(self, folder: Path, context: LoadContext) -> LoadedModel:
        self.loads += 1
        if self.loads <= self.fails:
            if self.touching:
                with open(folder / "config.json", "a", encoding="utf-8") as still_written:
                    still_written.write("\n")
            raise self.make_error()
        return super().load(folder, context)


def eio() -> OSError:
    return OSError(errno.EIO, "Input/output error")


@pytest.fixture
def fake_package(tmp_path: Path) -> Path:
    families = FamilyRegistry(families={"fake": (FAKE_FAMILY, FakeFamily())})
    engines = EngineRegistry(engines={"fake": (FAKE_ENGINE, FakeEnginePlugin())})
    return write_fixture(
        tmp_path / "tiny-fake", "fake", "all", 0, families=families, engines=engines, store=session_store()
    )


def flaky_container(package: Path, family: FlakyFamily, **settings: Any) -> Any:
    adapters = {
        "families": FamilyRegistry(families={"fake": (FAKE_FAMILY, family)}),
        "engines": EngineRegistry(engines={"fake": (FAKE_ENGINE, FakeEnginePlugin())}),
        "device": FakeDevice(),
    }
    return container_for([package], adapters=adapters, **settings)


def test_a_transient_failure_is_tried_again_and_health_says_when(fake_package: Path) -> None:
    family = FlakyFamily(fails=1, make_error=eio)
    container = flaky_container(fake_package, family, load_attempts=3, load_retry_seconds=2.0)
    runtime = container.runtime()
    from litestar.testing import TestClient

    with TestClient(container.app(), timeout=60) as client:
        deadline = time.monotonic() + 30
        health = client.get("/health")
        while "next in" not in (health.json().get("reason") or ""):
            assert time.monotonic() < deadline and not runtime.loaded.is_set(), health.json()
            time.sleep(0.05)
            health = client.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "loading"
        reason = health.json()["reason"]
        assert reason.startswith("loading (attempt 1 of 3, next in ") and reason.endswith(
            "s): OSError: [Errno 5] Input/output error"
        ), reason
        card = client.get("/v1/models").json()["data"][0]
        assert card["status"] == "loading" and card["reason"].startswith("loading (attempt 1 of 3, next in ")
        assert "\n" not in reason
        while not runtime.loaded.is_set():
            assert time.monotonic() < deadline, client.get("/health").json()
            time.sleep(0.05)
        ready = client.get("/health")
        assert ready.status_code == 200 and ready.json()["reason"] is None, ready.json()
        card = client.get("/v1/models").json()["data"][0]
        assert card["status"] == "ready" and card["reason"] is None
        assert client.post("/v1/embeddings", json={"input": "the cat"}).status_code == 200
    assert family.loads == 2


def test_the_attempts_run_out_into_one_reason(fake_package: Path) -> None:
    family = FlakyFamily(fails=99, make_error=eio)
    with serving(flaky_container(fake_package, family, load_attempts=3, load_retry_seconds=0.05)) as (client, _rt):
        health = client.get("/health").json()
    assert family.loads == 3
    assert health["status"] == "failed"
    assert health["reason"] == "OSError: [Errno 5] Input/output error (after 3 attempts)", health


def test_a_final_failure_is_not_tried_again(fake_package: Path) -> None:
    family = FlakyFamily(fails=99, make_error=lambda: ValueError("the package holds no embedding table"))
    with serving(flaky_container(fake_package, family, load_attempts=5, load_retry_seconds=0.05)) as (client, _rt):
        health = client.get("/health").json()
    assert family.loads == 1
    assert health["status"] == "failed" and health["reason"] == "ValueError: the package holds no embedding table"


def test_a_package_still_being_written_is_read_again(fake_package: Path) -> None:
    # whatever the error says, a package whose files changed during the attempt was not finished
    family = FlakyFamily(fails=1, make_error=lambda: ValueError("truncated file"), touching=True)
    with serving(flaky_container(fake_package, family, load_attempts=2, load_retry_seconds=0.05)) as (client, rt):
        assert rt.models["tiny-fake"].ready, rt.models["tiny-fake"].reason
        assert client.get("/health").status_code == 200
    assert family.loads == 2


def test_one_attempt_means_no_retry(fake_package: Path) -> None:
    family = FlakyFamily(fails=1, make_error=eio)
    with serving(flaky_container(fake_package, family, load_attempts=1)) as (client, _rt):
        health = client.get("/health").json()
    assert family.loads == 1 and health["reason"] == "OSError: [Errno 5] Input/output error"
