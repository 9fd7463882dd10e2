"""R-FAIR-4 through the runtime and the HTTP app, with two tenants: the tenant over its share or
its rate gets 429 `overloaded` with Retry-After, the other is served as if it were alone.

HTTP requests are the `default` tenant's until keys name tenants; the other tenant's work is
admitted through the runtime's submit path (`ServedModel.admitted` with a `Call` of that tenant).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.serving import serving
from tests.integration.test_fake_family import fake_container
from vllm_srun.adapters.call import Call
from vllm_srun.domain.errors import Overloaded
from vllm_srun.domain.scheduling.admission import AdmissionLimits
from vllm_srun.domain.scheduling.tenants import TenantPolicy, TenantTable


def test_a_tenant_holding_the_whole_queue_is_refused_and_another_is_served(fake_packages: list[Path]) -> None:
    limits = AdmissionLimits(max_queue=1, max_queued_tokens=100)
    with serving(fake_container(fake_packages[0], admission=limits)) as (client, rt):
        served = rt.models["fake-a"]
        assert served.admission is not None
        served.admission.tenants = TenantTable({"flood": TenantPolicy(weight=1.0)})
        flood = Call(tenant="flood")
        with served.admitted(flood, 1, 50):  # flood holds the model's whole queue (--max-queue 1)
            with pytest.raises(Overloaded) as refused, served.admitted(flood, 1, 10):
                pass
            assert "--max-queue 1" in str(refused.value) and refused.value.retry_after_s >= 1
            answered = client.post("/v1/embeddings", json={"input": "a dog"})  # the default tenant: in
            assert answered.status_code == 200, answered.text
        assert served.admission.pending_requests == 0


def test_a_tenant_over_its_token_rate_gets_429_with_retry_after_and_the_other_does_not(
    fake_packages: list[Path],
) -> None:
    limits = AdmissionLimits(max_queue=100, max_queued_tokens=100_000)
    with serving(fake_container(fake_packages[0], admission=limits)) as (client, rt):
        served = rt.models["fake-a"]
        assert served.admission is not None
        # the default tenant (every HTTP request for now) may send 20 tokens (body bytes) a second
        served.admission.tenants = TenantTable({"steady": TenantPolicy()}, default=TenantPolicy(tokens_per_s=20.0))
        body = b'{"input": "a dog"}'  # 18 bytes
        first = client.post("/v1/embeddings", content=body, headers={"content-type": "application/json"})
        assert first.status_code == 200, first.text
        refused = client.post("/v1/embeddings", content=body, headers={"content-type": "application/json"})
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "overloaded"
        assert refused.headers["retry-after"] == "1" and "20 tokens/s" in refused.json()["error"]["message"]
        with served.admitted(Call(tenant="steady"), 1, 5_000) as call:  # the other tenant: no rate of its own
            ticket = call.held.ticket if call.held is not None else None
            assert ticket is not None and ticket.tenant == "steady"
