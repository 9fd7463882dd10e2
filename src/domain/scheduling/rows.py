"""Rows: the unit of batching (R-BAT-1).

A request becomes one row per input (embeddings, classify), per window, per document (rerank)
or per question (decisions). A row carries its token count for the budgets and an opaque
payload (token ids, pixels…) that only the engine reads. A row belongs to its request's tenant
and carries its priority (R-FAIR-1, R-FAIR-3): they decide when it is taken, never what it answers.
A row of a request whose profile does not coalesce is `exact` (R-PROF-2): on a model that is not
batch-invariant it runs in a forward of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm_srun.domain.scheduling.tenants import DEFAULT_TENANT, Priority

DEFAULT_LANE = "text"


@dataclass(frozen=True, slots=True)
class RowSpec:
    """What a family renders for one row, before the scheduler numbers it."""

    tokens: int
    payload: Any = field(default=None, compare=False, repr=False)
    lane: str = DEFAULT_LANE


@dataclass(frozen=True, slots=True)
class Row:
    request_id: int
    index: int  # position inside its request: answers come back in this order
    tokens: int
    lane: str
    seq: int  # global arrival order, the tie-breaker everywhere
    payload: Any = field(default=None, compare=False, repr=False)
    tenant: str = DEFAULT_TENANT
    priority: Priority = Priority.INTERACTIVE
    exact: bool = False  # R-PROF-2: never shares a forward of a model that is not batch-invariant
