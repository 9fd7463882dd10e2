"""One worker and one front for the hostile tests, with short connection limits
(`clients.LIMITS`) and admission that lets large requests in side by side (`clients.ADMISSION`). The worker serves a tiny embedder and a tiny decision model; the front
serves them as deployments `embed` (two replicas) and `decide` (one)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hostile.clients import ADMISSION, LIMITS, QUEUED_TOKENS, Server, inventory, start


@pytest.fixture(scope="package")
def worker(encoder_fixture, decision_fixture) -> Iterator[Server]:  # type: ignore[no-untyped-def]
    argv = ["vllm_srun.app.cli", "serve", str(encoder_fixture("embed")), str(decision_fixture())]
    with start([*argv, "--result-cache-entries", "0", "--log-level", "warning", *LIMITS, *ADMISSION]) as server:
        yield server


@pytest.fixture(scope="package")
def front(encoder_fixture, decision_fixture, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:  # type: ignore[no-untyped-def]
    deployments = {
        "embed": {"artifact": str(encoder_fixture("embed")), "replicas": [{"device": "cpu"}, {"device": "cpu"}]},
        "decide": {"artifact": str(decision_fixture()), "replicas": [{"device": "cpu"}]},
    }
    for deployment in deployments.values():
        deployment["result_cache_entries"] = 0
        deployment["max_queued_tokens"] = QUEUED_TOKENS
    config = Path(tmp_path_factory.mktemp("hostile-front")) / "config.yaml"
    config.write_text(json.dumps({"global": {"model_catalog": {"deployments": deployments}}}))
    argv = ["vllm_srun.app.front_cli", "serve", "--config", str(config), "--log-level", "warning", *LIMITS]
    with start(argv) as server:
        deadline = time.monotonic() + 120
        while not all(w["state"] == "ready" for d in inventory(server)["deployments"] for w in d["workers"]):
            assert time.monotonic() < deadline, server.log()[-3000:]
            time.sleep(0.2)
        yield server


@pytest.fixture(params=["worker", "front"])
def target(request: pytest.FixtureRequest) -> Server:
    """Each attack against the worker and against the front."""
    server: Server = request.getfixturevalue(request.param)
    server.extra["kind"] = request.param
    return server
