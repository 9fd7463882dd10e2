"""A flooding tenant against a real worker and a real front (R-FAIR-4, R-FAIR-1, issue 23): the
key file holds tenants A (a `max_queued_tokens` of about one of its requests) and B (no limits).
A floods from many connections at once, B asks one request after another on its own. B gets no
429 and every B answer equals the one it got alone before the flood; A is answered 429
`overloaded` with Retry-After (its own limit, named in the message) once it holds its share, and
still gets answers in between; `/metrics` counts A's refusals and none of B's.

Against the front the limit is applied by its managed worker, which reads the front's key file
for the tenants' policies (`--tenant-policies`): the front itself knows no queue limits. The
front's flood stays under its 32 requests in flight per worker, whose 429s would go to anyone.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import json
import math
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.hostile.clients import Server, start
from tests.prometheus_text import metric
from tests.waiting import until

KEYS = {"A": "srk-tenant-a-" + "a" * 32, "B": "srk-tenant-b-" + "b" * 32}
A_TEXT = "flood " * 15  # four of them: a body of about 400 bytes, A's limit holds one
A_LIMIT = 600
B_ASKS = 30


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = Path(tmp_path_factory.mktemp("tenant-flood")) / "keys"
    path.write_text(f"A {digest(KEYS['A'])} 1 {A_LIMIT} -\nB {digest(KEYS['B'])}\n")
    return path


@pytest.fixture(scope="module", params=[("worker", 64), ("front", 24)], ids=["worker", "front"])
def target(request: pytest.FixtureRequest, encoder_fixture, keys: Path) -> Iterator[tuple[Server, int]]:  # type: ignore[no-untyped-def]
    kind, flood = request.param
    model = str(encoder_fixture("embed"))
    if kind == "worker":
        argv = ["vllm_srun.app.cli", "serve", model, "--result-cache-entries", "0", "--log-level", "warning"]
    else:
        folder = keys.parent / "front"
        folder.mkdir(exist_ok=True)
        embed = {"artifact": model, "replicas": [{"device": "cpu"}], "result_cache_entries": 0}
        config = folder / "config.yaml"
        config.write_text(json.dumps({"global": {"model_catalog": {"deployments": {"embed": embed}}}}))
        argv = ["vllm_srun.app.front_cli", "serve", "--config", str(config), "--log-level", "warning"]
    with start([*argv, "--api-key-file", str(keys)]) as server:
        server.extra["kind"] = kind
        yield server, flood


async def flood(server: Server, connections: int) -> tuple[list[httpx.Response], list[tuple[list[float], list[float]]]]:
    """A floods from CONNECTIONS connections while B asks B_ASKS times; returns A's answers and
    B's (alone, in the flood) vectors. Ends once B is done and A has been refused at least once."""
    a_headers = {"authorization": f"Bearer {KEYS['A']}"}
    b_headers = {"authorization": f"Bearer {KEYS['B']}"}
    a_answers: list[httpx.Response] = []
    stop = asyncio.Event()
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    async with (
        httpx.AsyncClient(base_url=server.base, timeout=60, limits=limits) as a_client,
        httpx.AsyncClient(base_url=server.base, timeout=60) as b_client,
    ):

        async def b_ask(n: int) -> list[float]:
            r = await b_client.post("/v1/embeddings", json={"input": f"B asks question {n}"}, headers=b_headers)
            assert r.status_code == 200, (r.status_code, r.text)
            return r.json()["data"][0]["embedding"]  # type: ignore[no-any-return]

        alone = [await b_ask(n) for n in range(B_ASKS)]

        async def a_flood(index: int) -> None:
            n = 0
            while not stop.is_set():
                body = {"input": [f"{A_TEXT} {index} {n} {part}" for part in range(4)]}
                a_answers.append(await a_client.post("/v1/embeddings", json=body, headers=a_headers))
                n += 1

        flooders = [asyncio.ensure_future(a_flood(i)) for i in range(connections)]
        try:
            await until(lambda: len(a_answers) >= connections, timeout=15, what="A's flood under way")
            during = [await b_ask(n) for n in range(B_ASKS)]
            await until(
                lambda: any(r.status_code == 429 for r in a_answers),
                timeout=15,
                what=lambda: (
                    f"A refused once over its share: {collections.Counter(r.status_code for r in a_answers)} {a_answers[0].text[:300]}"
                ),
            )
        finally:
            stop.set()
            await asyncio.gather(*flooders, return_exceptions=True)
    return a_answers, list(zip(alone, during, strict=True))


def test_a_flooding_tenant_is_refused_and_the_other_is_served_as_if_alone(target: tuple[Server, int]) -> None:
    server, connections = target
    a_answers, b_pairs = asyncio.run(flood(server, connections))
    for alone, during in b_pairs:  # every B answer is right: the one it got alone
        assert len(alone) == len(during)
        assert all(math.isclose(x, y, rel_tol=1e-4, abs_tol=1e-5) for x, y in zip(alone, during, strict=True))
    statuses = [r.status_code for r in a_answers]
    assert set(statuses) <= {200, 429}, sorted(set(statuses))
    assert statuses.count(200) > 0 and statuses.count(429) > 0
    for refused in (r for r in a_answers if r.status_code == 429):
        assert 1 <= int(refused.headers["retry-after"]) <= 60
        error = refused.json()["error"]
        assert error["code"] == "overloaded" and f"(its limit {A_LIMIT})" in error["message"], error
    text = httpx.get(server.base + "/metrics", timeout=10).text
    name = "vllm_srun_tenant_refusals_total" if server.extra["kind"] == "worker" else "vllm_sr_tenant_refusals_total"
    assert metric(text, name, tenant="A") == statuses.count(429)
    assert metric(text, name, tenant="B") == 0
