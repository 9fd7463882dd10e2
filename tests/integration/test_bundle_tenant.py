"""A bundle's tasks are admitted for the tenant of its key (R-FAIR-1, R-FAIR-4, R-ADM-1): a tenant
over its token rate gets 429 in every slot of its bundle, another tenant's bundle is answered;
`/metrics` counts the refusal for that tenant, and key refusals by route class, never the key."""

from __future__ import annotations

from pathlib import Path

from tests.integration.serving import serving
from tests.integration.test_fake_family import fake_container
from tests.prometheus_text import metric
from vllm_srun.adapters.http.auth import Authenticator
from vllm_srun.domain.security.api_keys import key_digest, parse_key_file

METERED_KEY = "srk-metered-key-for-the-bundle-test"
OTHER_KEY = "srk-other-key-for-the-bundle-test"
KEY_FILE = (
    f"metered {key_digest(METERED_KEY).hex()} - - 40\n"  # 40 tokens (body bytes) a second
    f"other   {key_digest(OTHER_KEY).hex()}\n"
)
TASKS = {"tasks": [{"id": "1", "embeddings": {"input": "a dog"}}, {"id": "2", "classify": {"input": "a cat"}}]}


def _bundle(client, key: str) -> list[dict]:
    answer = client.post("/v1/bundle", json=TASKS, headers={"authorization": f"Bearer {key}"})
    assert answer.status_code == 200, answer.text
    return answer.json()["results"]


def test_a_bundle_is_admitted_for_its_keys_tenant(fake_packages: list[Path]) -> None:
    table = parse_key_file(KEY_FILE)
    adapters = {"auth": Authenticator(lambda: table), "tenants": table.tenants}
    with serving(fake_container(fake_packages[0], adapters=adapters)) as (client, _rt):
        first = _bundle(client, METERED_KEY)  # a full bucket lets the first bundle in
        assert [r["status"] for r in first] == [200, 200]
        refused = _bundle(client, METERED_KEY)  # its bucket is empty now: both tasks, one unit
        assert [r["status"] for r in refused] == [429, 429]
        assert refused[0]["error"]["code"] == "overloaded" and "40 tokens/s" in refused[0]["error"]["message"]
        other = _bundle(client, OTHER_KEY)  # another tenant: no rate of its own, answered
        assert [r["status"] for r in other] == [200, 200]
        text = client.get("/metrics").text
        assert metric(text, "vllm_srun_tenant_refusals_total", model="fake-a", tenant="metered") == 1  # one unit
        assert metric(text, "vllm_srun_tenant_refusals_total", tenant="other") == 0


def test_key_refusals_are_counted_by_route_class_never_by_key(fake_packages: list[Path]) -> None:
    table = parse_key_file(KEY_FILE)
    with serving(fake_container(fake_packages[0], adapters={"auth": Authenticator(lambda: table)})) as (client, _rt):
        wrong = "srk-wrong-key-that-must-not-show"
        assert client.post("/v1/embeddings", json={"input": "a"}).status_code == 401
        assert (
            client.post("/v1/embeddings", json={"input": "a"}, headers={"authorization": f"Bearer {wrong}"}).status_code
            == 401
        )
        assert client.get("/v1/models").status_code == 401
        assert client.get("/openapi.json").status_code == 401
        text = client.get("/metrics").text
        assert metric(text, "vllm_srun_auth_refusals_total", route="api", code="unauthorized") == 3
        assert metric(text, "vllm_srun_auth_refusals_total", route="other", code="unauthorized") == 1
        assert wrong not in text and key_digest(wrong).hex() not in text and "/v1/embeddings" not in text
