"""A hostile burst against a real worker (R-ADM-1, R-API-9): 512 clients at once, each sending a
few requests on fresh connections, at a worker whose queue holds 16. Every request gets an
answer (none lost, none hung), every answer is 200 or 429 `overloaded` with a Retry-After of
1–60 s, the worker keeps serving afterwards, and its unanswered count returns to zero."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.e2e.front import post_once
from tests.e2e.server import running_server
from tests.prometheus_text import metric
from tests.waiting import until

pytestmark = pytest.mark.slow
CLIENTS = 512
EACH = 3


async def burst(base: str) -> list[tuple[int, dict[str, str], bytes]]:
    start = asyncio.Event()
    waiting = [0]

    async def client(index: int) -> list[tuple[int, dict[str, str], bytes]]:
        waiting[0] += 1
        await start.wait()
        out = []
        for n in range(EACH):
            body = json.dumps({"input": [f"client {index} asks {n}", "the movie was great fun"]}).encode()
            out.append(await post_once(base, "/v1/embeddings", body, timeout=120))
        return out

    tasks = [asyncio.ensure_future(client(i)) for i in range(CLIENTS)]
    await until(lambda: waiting[0] == CLIENTS, what="every client at the start line")
    start.set()
    return [answer for task in await asyncio.gather(*tasks) for answer in task]


def test_512_clients_get_200_or_429_with_retry_after_and_nothing_is_lost(encoder_fixture) -> None:  # type: ignore[no-untyped-def]
    folder = encoder_fixture("embed")
    with running_server(str(folder), "--max-queue", "16", "--result-cache-entries", "0") as base:
        answers = asyncio.run(burst(base))
        assert len(answers) == CLIENTS * EACH
        statuses = [status for status, _, _ in answers]
        assert set(statuses) <= {200, 429}, sorted(set(statuses))
        assert statuses.count(200) > 0 and statuses.count(429) > 0
        for status, headers, payload in answers:
            if status == 429:
                assert 1 <= int(headers["retry-after"]) <= 60
                assert json.loads(payload)["error"]["code"] == "overloaded"
        assert httpx.get(f"{base}/health", timeout=5).status_code == 200
        r = httpx.post(f"{base}/v1/embeddings", json={"input": "still here"}, timeout=30)
        assert r.status_code == 200
        text = httpx.get(f"{base}/metrics", timeout=5).text
        assert metric(text, "vllm_srun_unanswered_requests", model=folder.name) == 0
        assert metric(text, "vllm_srun_requests_total", model=folder.name, surface="embeddings", code="overloaded") == (
            statuses.count(429)
        )
