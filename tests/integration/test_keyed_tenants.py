"""Keys name tenants for fair sharing (R-AUTH-3 with R-FAIR-4), through the worker's HTTP app:
the key file's rate for one tenant refuses that tenant's second request (429) while the other
tenant, with the same body at the same moment, is served."""

from __future__ import annotations

import hashlib
from pathlib import Path

from tests.integration.serving import serving
from tests.integration.test_fake_family import fake_container
from vllm_srun.adapters.http.auth import Authenticator
from vllm_srun.domain.scheduling.admission import AdmissionLimits
from vllm_srun.domain.security.api_keys import parse_key_file


def test_the_key_file_s_tenant_policies_apply_to_its_keys(fake_packages: list[Path]) -> None:
    slow, free = "srk-slow-tenant-key", "srk-free-tenant-key"
    table = parse_key_file(
        f"slow {hashlib.sha256(slow.encode()).hexdigest()} - - 20\nfree {hashlib.sha256(free.encode()).hexdigest()}\n"
    )
    adapters = {"auth": Authenticator(lambda: table), "tenants": table.tenants}
    limits = AdmissionLimits(max_queue=100, max_queued_tokens=100_000)
    with serving(fake_container(fake_packages[0], adapters=adapters, admission=limits)) as (client, _rt):
        body = b'{"input": "a dog"}'  # 18 bytes: the slow tenant may send 20 a second

        def post(key: str) -> int:
            headers = {"content-type": "application/json", "authorization": f"Bearer {key}"}
            return client.post("/v1/embeddings", content=body, headers=headers).status_code

        assert post(slow) == 200
        assert post(slow) == 429  # over its rate
        assert [post(free) for _ in range(3)] == [200, 200, 200]  # the other tenant: as if alone
        assert (
            client.post("/v1/embeddings", content=body, headers={"content-type": "application/json"}).status_code == 401
        )
