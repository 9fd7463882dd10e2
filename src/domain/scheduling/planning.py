"""Forward plans (R-BAT-2/3/5/6/7, R-PROF-2): which queued rows run together, in which order.

Pure functions over rows. A plan is immutable; the scheduler walks it one forward at a time.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from vllm_srun.domain.scheduling.costs import CostModel
from vllm_srun.domain.scheduling.lanes import Accounting, Lane, forward_tokens, round_up
from vllm_srun.domain.scheduling.rows import Row

BATCH_INVARIANT_TOKENS = 512  # R-BAT-5: merged forwards of a batch-invariant model
# ... or fewer, down to this, where the engine's kernels change below 512 (`invariant_forward_tokens`)
MIN_INVARIANT_TOKENS = 256


def invariant_forward_tokens(kernel_switch_tokens: int | None) -> int | None:
    """The most counted tokens a merged forward of a batch-invariant model may hold (R-BAT-5),
    given the size past which its engine runs other kernels (None: the same kernels at every
    size): 512, or the switch where that is smaller, so every merged forward runs on the
    kernels the probe checked and a row longer than that runs alone, always on the same ones.
    None when the switch is below `MIN_INVARIANT_TOKENS`: merged forwards that small lose what
    merging gains, and the probe's own batches (family probe rows, under 256 tokens together)
    would cross it. E.g. where the oneDNN fast path times more than 10 % slower than eager at 529
    tokens but not at 265 (`domain.worker.kernels.DEFAULT_TIE`), its forwards merge up to 265 tokens and
    the model stays exact instead of falling back to the batch window."""
    if kernel_switch_tokens is None or kernel_switch_tokens >= BATCH_INVARIANT_TOKENS:
        return BATCH_INVARIANT_TOKENS
    if kernel_switch_tokens < MIN_INVARIANT_TOKENS:
        return None
    return kernel_switch_tokens


@dataclass(frozen=True, slots=True)
class Budget:
    max_num_seqs: int
    max_num_batched_tokens: int

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if self.max_num_batched_tokens < 8:
            raise ValueError("max_num_batched_tokens must be >= 8")


@dataclass(frozen=True, slots=True)
class ForwardBatch:
    lane: str
    rows: tuple[Row, ...]
    tokens: int  # as counted by the lane's accounting
    accounting: Accounting

    @property
    def request_ids(self) -> frozenset[int]:
        return frozenset(r.request_id for r in self.rows)


@dataclass(frozen=True, slots=True)
class ForwardPlan:
    batches: tuple[ForwardBatch, ...]

    @property
    def rows(self) -> int:
        return sum(len(b.rows) for b in self.batches)


def lane_token_limit(
    lane: Lane,
    budget: Budget,
    costs: CostModel,
    batch_invariant: bool,
    invariant_tokens: int = BATCH_INVARIANT_TOKENS,
) -> int:
    """The most counted tokens one forward of this lane may hold (a batch-invariant model's
    merged forwards at most INVARIANT_TOKENS)."""
    limit = budget.max_num_batched_tokens
    if lane.cap_tokens is not None:
        limit = min(limit, lane.cap_tokens)
    if lane.cap_seconds is not None:
        by_time = int(lane.cap_seconds / costs.seconds_per_token(lane.name) + 1e-6)
        limit = min(limit, max(by_time, 8))
    if batch_invariant:
        limit = min(limit, invariant_tokens)
    return max(limit, 8)


def plan_lane(rows: Sequence[Row], accounting: Accounting, max_rows: int, max_tokens: int) -> list[ForwardBatch]:
    """Cut one lane's rows into forwards within both budgets.

    Padded: longest rows first, so rows of similar length share a forward. Packed: arrival
    order. A row over the token budget on its own runs alone.
    """
    if accounting is Accounting.PADDED:
        ordered = sorted(rows, key=lambda r: (-r.tokens, r.seq))
    else:
        ordered = sorted(rows, key=lambda r: r.seq)
    batches: list[ForwardBatch] = []
    current: list[Row] = []
    lane = ordered[0].lane if ordered else ""

    def close() -> None:
        if current:
            counted = forward_tokens((r.tokens for r in current), accounting)
            batches.append(ForwardBatch(lane, tuple(current), counted, accounting))
            current.clear()

    width = 0  # padded: the (rounded) longest row of the open forward
    packed = 0  # packed: the counted tokens of the open forward
    for row in ordered:
        need = round_up(row.tokens)
        if current:
            if accounting is Accounting.PADDED:
                fits = (len(current) + 1) * max(width, need) <= max_tokens
            else:
                fits = packed + need <= max_tokens
            if len(current) >= max_rows or not fits:
                close()
                width = packed = 0
        current.append(row)
        width = max(width, need)
        packed += need
    close()
    return batches


def forwards_alone(rows: Sequence[Row], accounting: Accounting) -> list[ForwardBatch]:
    """R-PROF-2: one forward per row, in arrival order (exact rows of a model that is not
    batch-invariant: a row's answer is then the one it gets alone)."""
    return [
        ForwardBatch(row.lane, (row,), forward_tokens((row.tokens,), accounting), accounting)
        for row in sorted(rows, key=lambda r: r.seq)
    ]


def plan_forwards(
    rows: Iterable[Row],
    lanes: dict[str, Lane],
    budget: Budget,
    costs: CostModel,
    *,
    batch_invariant: bool = False,
    invariant_tokens: int = BATCH_INVARIANT_TOKENS,
) -> ForwardPlan:
    """Plan every queued row. Lanes never mix; the cheaper lane's forwards run first. Unless the
    model is batch-invariant, an exact row (R-PROF-2) runs alone, after its lane's merged forwards."""
    by_lane: dict[str, list[Row]] = {}
    for row in rows:
        if row.lane not in lanes:
            raise ValueError(f"row of request {row.request_id} names unknown lane {row.lane!r}")
        by_lane.setdefault(row.lane, []).append(row)
    planned: list[tuple[float, str, list[ForwardBatch]]] = []
    for name, lane_rows in by_lane.items():
        lane = lanes[name]
        limit = lane_token_limit(lane, budget, costs, batch_invariant, invariant_tokens)
        alone = [] if batch_invariant else [r for r in lane_rows if r.exact]
        merged = [r for r in lane_rows if not r.exact] if alone else lane_rows
        batches = plan_lane(merged, lane.accounting, budget.max_num_seqs, limit) + forwards_alone(
            alone, lane.accounting
        )
        estimate = costs.estimate(name, sum(b.tokens for b in batches))
        planned.append((estimate, name, batches))
    planned.sort(key=lambda item: (item[0], item[1]))
    return ForwardPlan(tuple(b for _, _, batches in planned for b in batches))
