"""The key file (R-AUTH-1): its format, one-line refusals naming the line, digests never echoed,
tenant policies, and lookups that compare every digest."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vllm_srun.domain.scheduling.tenants import TenantPolicy
from vllm_srun.domain.security.api_keys import KeyFileError, key_digest, key_line, parse_key_file


def digest_hex(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def test_lines_comments_and_blank_lines() -> None:
    text = f"""
# tenant sha256 [weight] [max_queued_tokens] [rate]
acme  {digest_hex("k-acme-1")}   2  4096  500   # the big one
acme  {digest_hex("k-acme-2")}
beta  {digest_hex("k-beta")} - 100

"""
    table = parse_key_file(text)
    assert len(table) == 3
    assert table.tenant_of("k-acme-1") == "acme"
    assert table.tenant_of("k-acme-2") == "acme"
    assert table.tenant_of("k-beta") == "beta"
    assert table.tenant_of("k-acme") is None
    assert table.tenant_of("") is None
    assert table.tenants.policy("acme") == TenantPolicy(weight=2.0, max_queued_tokens=4096, tokens_per_s=500.0)
    assert table.tenants.policy("beta") == TenantPolicy(max_queued_tokens=100)
    assert table.tenants.policy("nobody") == TenantPolicy()
    assert [e.line for e in table.entries] == [3, 4, 5]


def test_upper_case_hex_is_the_same_digest() -> None:
    table = parse_key_file(f"t {digest_hex('k').upper()}\n")
    assert table.tenant_of("k") == "t"


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("acme", "expected 'tenant sha256hex [weight] [max_queued_tokens] [rate]', got 1 fields"),
        (f"acme {'a' * 64} 1 2 3 4", "got 6 fields"),
        (f"-bad {'a' * 64}", "tenant '-bad': expected 1-64 letters"),
        (f"{'x' * 65} {'a' * 64}", "expected 1-64 letters"),
        ("acme secret-key-pasted-here", "the second field must be a key's SHA-256 (64 hex digits), not the key"),
        (f"acme {'a' * 63}", "64 hex digits"),
        (f"acme {'a' * 64} 0", "weight '0': expected a number > 0 or '-'"),
        (f"acme {'a' * 64} nan", "weight 'nan'"),
        (f"acme {'a' * 64} inf", "weight 'inf'"),
        (f"acme {'a' * 64} 1 0", "max_queued_tokens '0': expected an integer >= 1 or '-'"),
        (f"acme {'a' * 64} 1 1.5", "max_queued_tokens '1.5'"),
        (f"acme {'a' * 64} 1 10 -3", "rate '-3': expected a number > 0"),
    ],
)
def test_a_bad_line_is_refused_in_one_line_naming_it(line: str, expected: str) -> None:
    with pytest.raises(KeyFileError) as refused:
        parse_key_file(f"# header\n\n{line}\n", source="keys.txt")
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("keys.txt:3: ")
    assert expected in message


def test_a_pasted_key_is_never_echoed() -> None:
    with pytest.raises(KeyFileError) as refused:
        parse_key_file("acme sk-live-0123456789abcdef\n")
    assert "sk-live" not in str(refused.value)


def test_a_digest_twice_is_refused() -> None:
    line = f"acme {digest_hex('k')}\n"
    with pytest.raises(KeyFileError, match=r"key file:2: the same key digest as line 1$"):
        parse_key_file(line + line.replace("acme", "beta"))


def test_a_tenant_s_policy_fields_must_agree_across_its_lines() -> None:
    text = f"acme {digest_hex('a')} 2\nacme {digest_hex('b')} 3\n"
    with pytest.raises(KeyFileError, match=r"key file:2: tenant acme: weight 3 differs from line 1's"):
        parse_key_file(text)
    same = parse_key_file(f"acme {digest_hex('a')} 2\nacme {digest_hex('b')} 2.0 7\n")
    assert same.tenants.policy("acme") == TenantPolicy(weight=2.0, max_queued_tokens=7)


def test_key_line_round_trips_and_refuses_bad_tenants() -> None:
    line = key_line("team-a.prod_1", key_digest("k"))
    assert parse_key_file(line).tenant_of("k") == "team-a.prod_1"
    with pytest.raises(ValueError, match="expected 1-64 letters"):
        key_line("bad name", key_digest("k"))


@given(
    keys=st.dictionaries(
        st.text(min_size=1, max_size=40),
        st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,10}", fullmatch=True),
        min_size=1,
        max_size=8,
    ),
    other=st.text(max_size=40),
)
def test_every_written_key_finds_its_tenant_and_no_other_key_does(keys: dict[str, str], other: str) -> None:
    table = parse_key_file("".join(key_line(tenant, key_digest(key)) for key, tenant in keys.items()))
    for key, tenant in keys.items():
        assert table.tenant_of(key) == tenant
    assert table.tenant_of(other) == keys.get(other)
