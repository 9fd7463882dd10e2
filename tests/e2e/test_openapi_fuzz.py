"""schemathesis against our own OpenAPI document, over every POST route of the worker and of
the front: generated requests (valid and invalid) never get a 5xx, and every answer conforms to
the document (status code, content type and body schema). Each worker route is fuzzed against a
worker whose one model serves it, so generated bodies without `model` reach the surface; the
front is fuzzed on all routes with one deployment (a decision model)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import checks
from schemathesis.core.failures import FailureGroup

from tests.e2e.front import running_front
from tests.e2e.server import running_server

pytestmark = pytest.mark.slow
CHECKS = [checks.status_code_conformance, checks.content_type_conformance, checks.response_schema_conformance]
DECISION_ROUTES = ("/v1/decisions", "/v1/systemone", "/v1/systemone/batches")


def fuzz(base: str, paths: tuple[str, ...], examples: int = 30) -> tuple[list[str], list[int]]:
    """(failures, statuses) of generated requests to the POST routes PATHS of the server at BASE."""
    schema = schemathesis.openapi.from_url(f"{base}/openapi.json")
    failures: list[str] = []
    statuses: list[int] = []
    for operation in schema.get_all_operations():
        op = operation.ok()
        if op.method.upper() != "POST" or op.path not in paths:
            continue

        @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(case=op.as_strategy())
        def run(case) -> None:  # type: ignore[no-untyped-def]
            response = case.call(base_url=base, timeout=30)
            statuses.append(response.status_code)
            # a generated options.deadline_ms of a fraction of a millisecond is honoured with 504
            path = case.operation.path
            deadline = response.status_code == 504 and response.json()["error"]["code"] == "deadline_exceeded"
            if response.status_code >= 500 and not deadline:
                failures.append(f"{path}: {response.status_code} for {case.body!r}"[:300])
            try:
                case.validate_response(response, checks=CHECKS)
            except FailureGroup as exc:  # every failed check of this answer
                failures.append(f"{path}: {[str(e).splitlines()[0] for e in exc.exceptions]} for {case.body!r}"[:300])

        run()
    return failures, statuses


def test_generated_requests_never_get_a_5xx(minilm_server: str) -> None:
    failures, statuses = fuzz(minilm_server, ("/v1/embeddings",), examples=40)
    assert failures == []
    assert len(statuses) >= 20 and 200 in statuses  # it did generate (and some were served)


@pytest.fixture(scope="module")
def encoder_workers(encoder_fixture) -> Iterator[dict[str, str]]:  # type: ignore[no-untyped-def]
    with (
        running_server(str(encoder_fixture("classify")), "--result-cache-entries", "0") as classify,
        running_server(str(encoder_fixture("rerank")), "--result-cache-entries", "0") as rerank,
    ):
        yield {"classify": classify, "rerank": rerank}


@pytest.fixture(scope="module")
def decision_worker(decision_fixture) -> Iterator[str]:  # type: ignore[no-untyped-def]
    with running_server(str(decision_fixture()), "--result-cache-entries", "0") as base:
        yield base


@pytest.mark.parametrize(
    ("model", "paths"), [("classify", ("/v1/classify",)), ("rerank", ("/v1/rerank", "/v2/rerank"))]
)
def test_every_encoder_route(encoder_workers: dict[str, str], model: str, paths: tuple[str, ...]) -> None:
    failures, statuses = fuzz(encoder_workers[model], paths)
    assert failures == []
    assert len(statuses) >= 20 * len(paths) and 200 in statuses


def test_every_decision_route(decision_worker: str) -> None:
    failures, statuses = fuzz(decision_worker, DECISION_ROUTES)
    assert failures == []
    assert len(statuses) >= 60 and 200 in statuses


def test_the_bundle_route(decision_worker: str) -> None:
    failures, statuses = fuzz(decision_worker, ("/v1/bundle",))
    assert failures == []
    assert len(statuses) >= 20 and 200 in statuses


def test_every_route_through_the_front(decision_fixture, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    routes = ("/v1/embeddings", "/v1/classify", "/v1/rerank", "/v2/rerank", *DECISION_ROUTES, "/v1/bundle")
    with running_front(str(decision_fixture()), "--platform", "cpu", "--result-cache-entries", "0") as front:
        failures, statuses = fuzz(front.base, routes, examples=20)
    assert failures == []
    assert len(statuses) >= 100 and 200 in statuses
