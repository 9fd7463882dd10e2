from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.server import WORKERS, running_server
from tests.openapi_check import check


def _from_a_worker(request: Any) -> bool:
    url = request.url
    return f"{url.scheme}://{url.host}:{url.port}" in WORKERS


def _http_clients() -> list[Any]:
    """The HTTP client libraries the tests' clients use: httpx, and httpx2 (the openai client's)."""
    modules: list[Any] = [httpx]
    try:
        import httpx2

        modules.append(httpx2)
    except ImportError:
        pass
    return modules


@pytest.fixture(autouse=True, scope="session")
def answers_follow_the_openapi_document() -> Iterator[None]:
    """Every answer of a worker to httpx or httpx2 (direct calls, the openai and cohere clients)
    is checked against the worker's OpenAPI document (`tests/openapi_check.py`); fronts' are not.
    A worker never streams, so an answer a client asked to stream (the openai client always does)
    is read whole first; the client then reads it from memory."""
    with pytest.MonkeyPatch.context() as patch:
        for module in _http_clients():
            sync_send, async_send = module.Client.send, module.AsyncClient.send

            def send(self: Any, request: Any, *, _send: Any = sync_send, **kwargs: Any) -> Any:
                response = _send(self, request, **kwargs)
                if _from_a_worker(request):
                    check(response)
                return response

            async def asend(self: Any, request: Any, *, _send: Any = async_send, **kwargs: Any) -> Any:
                response = await _send(self, request, **kwargs)
                if _from_a_worker(request):
                    await response.aread()
                    check(response)
                return response

            patch.setattr(module.Client, "send", send)
            patch.setattr(module.AsyncClient, "send", asend)
        yield


@pytest.fixture(scope="session")
def minilm_server(minilm_dir: Path) -> Iterator[str]:
    """The embedded default, served the way the README says: `vllm-srun serve` with no MODEL."""
    # the batching tests count forwards of repeated texts: no result cache here (test_encoder_e2e has it on)
    with running_server("--max-request-bytes", "200000", "--result-cache-entries", "0") as base:
        yield base
