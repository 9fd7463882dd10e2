"""API keys (R-AUTH-1): the key file's lines, the table they make, and who a presented key is.

A key file has one key per line:

    # tenant  sha256-of-key                                                     [weight] [max_queued_tokens] [rate]
    acme      9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08  2        65536               5000

- `tenant`: the name requests with this key are counted, shared and limited under
  (`domain/scheduling/tenants.py`); letters, digits, `.`, `_`, `-`; at most 64 characters;
- the key's SHA-256, 64 hex digits: the file never holds a key itself;
- optional, in this order, `-` for "not set": the tenant's weight (> 0), its `max_queued_tokens`
  (>= 1) and its token rate per second (> 0), the `TenantPolicy` fields.

Blank lines and `#` comments are ignored. A tenant may have several keys (rotation): a policy
field given on more than one of its lines must be the same on each. A digest may appear once.
Every refusal is one line naming the line number, and never repeats a digest.

The presented key is hashed and compared with every digest of the table with
`hmac.compare_digest`, without stopping at the first match, so the time an answer takes does not
depend on which digest (or how much of one) matched.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from vllm_srun.domain.errors import DomainError
from vllm_srun.domain.scheduling.tenants import TenantPolicy, TenantTable

DIGEST_HEX = re.compile(r"[0-9a-fA-F]{64}")
TENANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
TENANT_RULE = "1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"
UNSET = "-"
POLICY_FIELDS = ("weight", "max_queued_tokens", "rate")


class KeyFileError(ValueError):
    """A key file that cannot be used; the message is one line (`FILE:LINE: why`)."""


class Unauthorized(DomainError):
    """No key, or a key that is not in the table (401 with `WWW-Authenticate: Bearer`)."""

    code = "unauthorized"


def key_digest(key: str | bytes) -> bytes:
    """The SHA-256 of a key as presented (a str as its UTF-8 bytes)."""
    raw = key if isinstance(key, bytes) else key.encode("utf-8", "surrogatepass")
    return hashlib.sha256(raw).digest()


def key_line(tenant: str, digest: bytes, policy: Sequence[float | int | None] = ()) -> str:
    """The key file line of one key, with the POLICY fields given (weight, max_queued_tokens, rate
    in that order; None for "not set", written `-`; none: the tenant's other lines, or defaults)."""
    if not TENANT_NAME.fullmatch(tenant):
        raise ValueError(f"tenant {tenant[:64]!r}: expected {TENANT_RULE}")
    columns = [UNSET if value is None else f"{value:g}" if isinstance(value, float) else str(value) for value in policy]
    while columns and columns[-1] == UNSET:
        columns.pop()
    return " ".join([tenant, digest.hex(), *columns]) + "\n"


@dataclass(frozen=True, slots=True)
class KeyEntry:
    tenant: str
    digest: bytes  # 32 bytes
    line: int


@dataclass(frozen=True, slots=True)
class KeyTable:
    """The keys of one key file and the tenant policies it sets."""

    entries: tuple[KeyEntry, ...] = ()
    policies: dict[str, TenantPolicy] = field(default_factory=dict)

    @property
    def tenants(self) -> TenantTable:
        """The policies by tenant (a tenant without policy fields gets the default policy)."""
        return TenantTable(dict(self.policies))

    def tenant_of(self, key: str | bytes) -> str | None:
        """The tenant of KEY, or None when no entry's digest is KEY's SHA-256. Every entry is
        compared (constant time each), whatever matched."""
        presented = key_digest(key)
        found: str | None = None
        for entry in self.entries:
            if hmac.compare_digest(presented, entry.digest) and found is None:
                found = entry.tenant
        return found

    def __len__(self) -> int:
        return len(self.entries)


def parse_key_file(text: str, source: str = "key file") -> KeyTable:
    """The KeyTable of a key file's TEXT; KeyFileError (`SOURCE:LINE: why`) on the first bad line."""
    entries: list[KeyEntry] = []
    seen: dict[bytes, int] = {}
    fields: dict[str, dict[str, tuple[float | int, int]]] = {}  # tenant -> field -> (value, line)
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source}:{number}"
        parts = line.split()
        if len(parts) < 2 or len(parts) > 2 + len(POLICY_FIELDS):
            raise KeyFileError(
                f"{where}: expected 'tenant sha256hex [weight] [max_queued_tokens] [rate]', got {len(parts)} fields"
            )
        tenant, digest_hex, *policy = parts
        if not TENANT_NAME.fullmatch(tenant):
            raise KeyFileError(f"{where}: tenant {tenant[:64]!r}: expected {TENANT_RULE}")
        if not DIGEST_HEX.fullmatch(digest_hex):
            # never echo it: it may be a key pasted by mistake
            raise KeyFileError(f"{where}: the second field must be a key's SHA-256 (64 hex digits), not the key")
        digest = bytes.fromhex(digest_hex)
        if digest in seen:
            raise KeyFileError(f"{where}: the same key digest as line {seen[digest]}")
        seen[digest] = number
        known = fields.setdefault(tenant, {})
        for name, text_value in zip(POLICY_FIELDS, policy, strict=False):
            if text_value == UNSET:
                continue
            value = _policy_value(name, text_value, where)
            if name in known and known[name][0] != value:
                raise KeyFileError(
                    f"{where}: tenant {tenant}: {name} {text_value} differs from line {known[name][1]}'s"
                )
            known.setdefault(name, (value, number))
        entries.append(KeyEntry(tenant, digest, number))
    policies = {tenant: _policy(values) for tenant, values in fields.items() if values}
    return KeyTable(tuple(entries), policies)


def _policy_value(name: str, text: str, where: str) -> float | int:
    try:
        if name == "max_queued_tokens":
            value: float | int = int(text)
            if value < 1:
                raise ValueError
            return value
        value = float(text)
    except ValueError:
        raise KeyFileError(f"{where}: {name} {text[:32]!r}: expected {_rule(name)}") from None
    if not (math.isfinite(value) and value > 0):
        raise KeyFileError(f"{where}: {name} {text[:32]!r}: expected {_rule(name)}")
    return value


def _rule(name: str) -> str:
    return "an integer >= 1 or '-'" if name == "max_queued_tokens" else "a number > 0 or '-'"


def _policy(values: dict[str, tuple[float | int, int]]) -> TenantPolicy:
    def get(name: str) -> float | int | None:
        return values[name][0] if name in values else None

    weight = get("weight")
    queued = get("max_queued_tokens")
    rate = get("rate")
    return TenantPolicy(
        weight=1.0 if weight is None else float(weight),
        max_queued_tokens=None if queued is None else int(queued),
        tokens_per_s=None if rate is None else float(rate),
    )
