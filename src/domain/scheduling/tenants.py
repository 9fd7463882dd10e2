"""Tenants and their policies (R-FAIR-1): who a request is for, and what share of a model it gets.

Every request, and every row it becomes, belongs to a tenant (`DEFAULT_TENANT` until keys name
one). A tenant's `TenantPolicy` says its weight in the scheduler's deficit round robin
(`domain/scheduling/fairness.py`, R-FAIR-2), the most tokens it may hold unanswered at one model, and the
token rate it may send (R-FAIR-4). Policies come from a `TenantTable` looked up by name; a tenant
the table does not name gets the table's default policy.

`Priority` orders the rows of one tenant (R-FAIR-3): `interactive` rows before `batch` rows.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

DEFAULT_TENANT = "default"


class Priority(enum.Enum):
    """`options.priority`: the order of one tenant's rows (interactive first)."""

    INTERACTIVE = "interactive"
    BATCH = "batch"


@dataclass(frozen=True, slots=True)
class TenantPolicy:
    weight: float = 1.0  # share of forward tokens while backlogged, relative to the others'
    max_queued_tokens: int | None = None  # None: only the model's own limit applies
    tokens_per_s: float | None = None  # admitted tokens per second over time; None: no rate

    def __post_init__(self) -> None:
        if not (math.isfinite(self.weight) and self.weight > 0):
            raise ValueError(f"a tenant's weight must be > 0, got {self.weight}")
        if self.max_queued_tokens is not None and self.max_queued_tokens < 1:
            raise ValueError(f"a tenant's max_queued_tokens must be >= 1, got {self.max_queued_tokens}")
        if self.tokens_per_s is not None and not (math.isfinite(self.tokens_per_s) and self.tokens_per_s > 0):
            raise ValueError(f"a tenant's token rate must be > 0, got {self.tokens_per_s}")


@dataclass(frozen=True, slots=True)
class TenantTable:
    """Policies by tenant name; any other tenant gets `default`."""

    policies: Mapping[str, TenantPolicy] = field(default_factory=dict)
    default: TenantPolicy = TenantPolicy()

    def policy(self, tenant: str) -> TenantPolicy:
        return self.policies.get(tenant, self.default)

    def weight(self, tenant: str) -> float:
        return self.policy(tenant).weight


DEFAULT_TENANTS = TenantTable()
