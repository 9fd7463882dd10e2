"""R-FAIR-4: per-tenant admission. A tenant over its own token limit, its token rate or its
weight's share of the model's limits gets 429 with a Retry-After; the other tenants are admitted
as if it were not there."""

from __future__ import annotations

import pytest

from tests.fakes import FakeClock
from vllm_srun.domain.errors import Overloaded
from vllm_srun.domain.scheduling.admission import OVERSHARE, Admission, AdmissionLimits
from vllm_srun.domain.scheduling.tenants import DEFAULT_TENANT, TenantPolicy, TenantTable
from vllm_srun.domain.scheduling.token_rate import TokenRate


def test_a_tenant_over_its_own_token_limit_is_refused_and_no_other() -> None:
    clock = FakeClock()
    table = TenantTable({"flood": TenantPolicy(max_queued_tokens=100)})
    admission = Admission(AdmissionLimits(max_queue=100, max_queued_tokens=10_000), tenants=table)
    first = admission.admit(1, 80, clock.now(), "flood")  # alone it may hold any size
    with pytest.raises(Overloaded) as refused:
        admission.admit(1, 30, clock.now(), "flood")  # 80 + 30 > 100
    assert "'flood'" in str(refused.value) and "its limit 100" in str(refused.value)
    assert 1 <= refused.value.retry_after_s <= 60
    admission.admit(1, 5_000, clock.now(), "steady")  # the steady tenant: as if flood were not there
    admission.admit(1, 20, clock.now(), "flood")  # 80 + 20 = 100: within its limit
    admission.release(first, clock.now(), answered=True)
    assert admission.held("flood") == (1, 20) and admission.held("steady") == (1, 5_000)


def test_a_tenant_over_its_token_rate_waits_what_its_bucket_needs() -> None:
    clock = FakeClock()
    table = TenantTable({"flood": TenantPolicy(tokens_per_s=100.0)})
    admission = Admission(AdmissionLimits(max_queue=100, max_queued_tokens=10_000), tenants=table)
    admission.release(admission.admit(1, 100, clock.now(), "flood"), clock.now(), answered=True)  # a second's worth
    with pytest.raises(Overloaded) as refused:
        admission.admit(1, 50, clock.now(), "flood")
    assert refused.value.retry_after_s == 1 and "100 tokens/s" in str(refused.value)
    admission.admit(1, 5_000, clock.now(), "steady")  # no rate of its own: admitted
    clock.advance(0.5)  # 50 tokens back in its bucket
    admission.admit(1, 50, clock.now(), "flood")
    with pytest.raises(Overloaded):
        admission.admit(1, 10, clock.now(), "flood")


def test_a_request_larger_than_a_seconds_worth_gets_in_on_a_full_bucket_and_pays_it_back() -> None:
    clock = FakeClock()
    rate = TokenRate(100.0, clock.now())
    assert rate.wait_s(1_000, clock.now()) == 0  # a full bucket admits it
    rate.take(1_000, clock.now())  # 900 tokens in debt
    assert rate.wait_s(10, clock.now()) == pytest.approx(9.1)
    clock.advance(9.1)
    assert rate.wait_s(10, clock.now()) == pytest.approx(0.0, abs=1e-9)


def test_past_the_models_limits_only_a_tenant_over_its_weights_share_is_refused() -> None:
    clock = FakeClock()
    table = TenantTable({"flood": TenantPolicy(weight=1.0), "steady": TenantPolicy(weight=3.0)})
    admission = Admission(AdmissionLimits(max_queue=4, max_queued_tokens=1_000), tenants=table)
    for _ in range(4):
        admission.admit(1, 10, clock.now(), "flood")  # the model is full, all of it flood's
    with pytest.raises(Overloaded) as refused:
        admission.admit(1, 10, clock.now(), "flood")
    assert "--max-queue 4" in str(refused.value)
    # steady holds nothing: it gets in; its share is 3/4 of the limits while both hold work
    for _ in range(3):
        admission.admit(1, 10, clock.now(), "steady")
    with pytest.raises(Overloaded):
        admission.admit(1, 10, clock.now(), "steady")  # 4 > 3/4 × 4
    with pytest.raises(Overloaded):
        admission.admit(1, 10, clock.now(), "flood")


def test_tenants_within_their_share_never_take_the_model_past_oversharing() -> None:
    clock = FakeClock()
    tenants = [f"t{i}" for i in range(10)]
    admission = Admission(AdmissionLimits(max_queue=4, max_queued_tokens=1_000))
    for tenant in tenants:
        try:
            admission.admit(1, 10, clock.now(), tenant)
        except Overloaded:
            pass
    assert admission.pending_requests == OVERSHARE * 4


def test_one_tenant_is_admitted_exactly_as_before() -> None:
    clock = FakeClock()
    admission = Admission(AdmissionLimits(max_queue=2, max_queued_tokens=100))
    admission.admit(1, 90, clock.now())
    with pytest.raises(Overloaded, match="--max-queued-tokens 100"):
        admission.admit(1, 20, clock.now(), DEFAULT_TENANT)
    admission.admit(1, 10, clock.now())
    with pytest.raises(Overloaded, match="--max-queue 2"):
        admission.admit(1, 0, clock.now())


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ({"weight": 0.0}, "weight must be > 0"),
        ({"weight": float("nan")}, "weight must be > 0"),
        ({"max_queued_tokens": 0}, "max_queued_tokens must be >= 1"),
        ({"tokens_per_s": -1.0}, "token rate must be > 0"),
    ],
)
def test_bad_policies_are_refused_in_one_line(policy: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TenantPolicy(**policy)  # type: ignore[arg-type]


def test_unknown_tenants_get_the_default_policy() -> None:
    table = TenantTable({"a": TenantPolicy(weight=2.0)}, default=TenantPolicy(weight=0.5, tokens_per_s=10.0))
    assert table.policy("a").weight == 2.0
    assert table.policy("someone") == TenantPolicy(weight=0.5, tokens_per_s=10.0)
