"""R-PROF: the profiles' switches, which profile a model serves, what a request may ask for, and
the refusals of contradicting settings (pure domain)."""

from __future__ import annotations

import pytest

from vllm_srun.domain.errors import InvalidRequest
from vllm_srun.domain.settings import profiles
from vllm_srun.domain.settings.dtypes import memory_refusal, resident_bytes
from vllm_srun.domain.settings.profiles import (
    BATCHING,
    EXACT,
    MAX_SPEED,
    PROFILES,
    SHARED_CONTEXT,
    answer_numerics,
    enabled,
    precision_is_published,
    profile_for,
    runs_alone,
    serving_profile,
    settings_refusal,
)


def test_the_four_profiles_are_upstreams_names_and_only_exact_is_exact() -> None:
    assert profiles.NAMES == ("exact", "shared_context", "batching", "max_speed")
    assert {name: p.numerics for name, p in PROFILES.items()} == {
        "exact": "exact",
        "shared_context": "approximate",
        "batching": "approximate",
        "max_speed": "approximate",
    }
    exact, shared, batching, fast = (PROFILES[n] for n in profiles.NAMES)
    assert (exact.coalesces, exact.shares_context, exact.other_precision) == (False, False, False)
    assert (shared.coalesces, shared.shares_context) == (False, True)  # exact plus a shared context
    assert (batching.coalesces, batching.shares_context) == (True, False)
    assert fast.covers(shared) and fast.covers(batching) and not batching.covers(shared)
    assert PROFILES[MAX_SPEED].card() == {
        "name": "max_speed",
        "numerics": "approximate",
        "description": PROFILES[MAX_SPEED].description,
    }


@pytest.mark.parametrize(
    ("asked", "shared", "other", "serves"),
    [
        (None, None, False, EXACT),  # the default, as upstream
        (None, False, False, EXACT),
        (None, True, False, SHARED_CONTEXT),  # --enable-shared-context is a spelling of shared_context
        (None, None, True, MAX_SPEED),  # another --dtype, unset profile: the profile that allows it
        (None, True, True, MAX_SPEED),
        (BATCHING, None, False, BATCHING),
        (BATCHING, False, False, BATCHING),
        (SHARED_CONTEXT, True, False, SHARED_CONTEXT),
        (MAX_SPEED, None, True, MAX_SPEED),
        (EXACT, False, False, EXACT),
    ],
)
def test_the_serving_profile(asked: str | None, shared: bool | None, other: bool, serves: str) -> None:
    assert serving_profile(asked, shared, other_precision=other).name == serves


@pytest.mark.parametrize(
    ("asked", "shared", "other", "says"),
    [
        (EXACT, True, False, "--enable-shared-context contradicts profile exact"),
        (BATCHING, True, False, "--enable-shared-context contradicts profile batching"),
        (SHARED_CONTEXT, False, False, "--no-enable-shared-context contradicts profile shared_context"),
        (MAX_SPEED, False, False, "--no-enable-shared-context contradicts profile max_speed"),
        (EXACT, None, True, "profile exact serves the published precision only"),
        (BATCHING, None, True, "profile batching serves the published precision only"),
        ("fastest", None, False, "profile must be one of exact, shared_context, batching, max_speed (got 'fastest')"),
    ],
)
def test_settings_that_contradict_a_named_profile_are_refused_in_one_line(
    asked: str, shared: bool | None, other: bool, says: str
) -> None:
    with pytest.raises(ValueError) as refused:
        serving_profile(asked, shared, other_precision=other)
    assert str(refused.value).startswith(says) and "\n" not in str(refused.value)


def test_settings_refusal_knows_a_cpus_published_precision() -> None:
    assert settings_refusal(EXACT, None, "bfloat16", "cpu") == (
        "profile exact serves the published precision only (float32 on a CPU); --dtype bfloat16 needs profile max_speed"
    )
    assert settings_refusal(EXACT, None, "float32", "cpu") is None  # FP32 is every family's on a CPU
    assert settings_refusal(None, None, "bfloat16", "cpu") is None  # unset: settles as max_speed at the load
    assert settings_refusal(MAX_SPEED, None, "bfloat16", "cpu") is None
    assert settings_refusal(EXACT, None, "bfloat16", "cuda:0") is None  # a BF16 decoder publishes BF16: the load says
    assert settings_refusal(BATCHING, True) is not None


def test_published_precision() -> None:
    assert precision_is_published("auto", "float32", "float32")
    assert precision_is_published("float32", "float32", "float32")  # a value equal to auto's is auto (R-DT-2)
    assert not precision_is_published("bfloat16", "bfloat16", "float32")
    assert not precision_is_published("float32", "float32", "bfloat16")  # an FP32 decoder on a GPU: not published


def test_a_model_answers_exact_and_its_serving_profile_and_refuses_the_others() -> None:
    assert [p.name for p in enabled(PROFILES[EXACT])] == [EXACT]
    assert [p.name for p in enabled(PROFILES[BATCHING])] == [EXACT, BATCHING]
    assert profile_for(None, PROFILES[BATCHING]).name == BATCHING
    assert profile_for(EXACT, PROFILES[BATCHING]).name == EXACT  # exact is always answerable
    with pytest.raises(InvalidRequest) as refused:
        profile_for(MAX_SPEED, PROFILES[BATCHING])
    assert refused.value.code == "invalid_request"
    assert (
        refused.value.message == "options.profile 'max_speed' is not enabled for this model (enabled: exact, batching)"
    )
    with pytest.raises(InvalidRequest, match=r"enabled: exact\)$"):
        profile_for(BATCHING, PROFILES[EXACT])
    # a model computing in another precision has no exact answer to give
    assert [p.name for p in enabled(PROFILES[MAX_SPEED], published=False)] == [MAX_SPEED]
    with pytest.raises(InvalidRequest) as refused:
        profile_for(EXACT, PROFILES[MAX_SPEED], published=False)
    assert refused.value.message == (
        "options.profile 'exact' is not enabled for this model (it computes in another precision than the "
        "published one) (enabled: max_speed)"
    )


@pytest.mark.parametrize("name", profiles.NAMES)
@pytest.mark.parametrize("invariant", [True, False])
def test_rows_run_alone_only_without_coalescing_on_a_model_that_is_not_batch_invariant(
    name: str, invariant: bool
) -> None:
    profile = PROFILES[name]
    assert runs_alone(profile, invariant) == (not invariant and name in (EXACT, SHARED_CONTEXT))


def test_what_an_answer_promises() -> None:
    assert answer_numerics(PROFILES[EXACT], False, False) == "exact"  # its rows ran alone
    assert answer_numerics(PROFILES[BATCHING], True, False) == "exact"  # merging changes no bit there
    assert answer_numerics(PROFILES[BATCHING], False, False) == "approximate"
    assert answer_numerics(PROFILES[SHARED_CONTEXT], True, False) == "approximate"
    assert answer_numerics(PROFILES[MAX_SPEED], True, False) == "approximate"
    assert answer_numerics(PROFILES[MAX_SPEED], False, True) == "deterministic"


def test_memory_budget_names_both_figures() -> None:
    assert resident_bytes(1000, "float32") == 4000 and resident_bytes(1000, "bfloat16") == 2000
    assert memory_refusal(None, "float32", 0.001) is None  # no weight count: nothing to refuse on
    assert memory_refusal(10**9, "float32", None) is None
    assert memory_refusal(10**8, "float32", 1.0) is None  # 0.37 GiB
    line = memory_refusal(10**9, "float32", 2.0)
    assert line == (
        "the model's estimated resident size is 3.73 GiB (1000000000 weights at float32), "
        "over its memory budget of 2 GiB (memory_budget_gib)"
    )
    assert memory_refusal(10**9, "bfloat16", 2.0) is None  # 1.86 GiB at half precision
