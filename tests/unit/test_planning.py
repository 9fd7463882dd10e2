from __future__ import annotations

import pytest

from vllm_srun.domain.scheduling.costs import CostModel
from vllm_srun.domain.scheduling.lanes import Accounting, Lane, forward_tokens, round_up
from vllm_srun.domain.scheduling.planning import (
    BATCH_INVARIANT_TOKENS,
    MIN_INVARIANT_TOKENS,
    Budget,
    invariant_forward_tokens,
    lane_token_limit,
    plan_forwards,
    plan_lane,
)
from vllm_srun.domain.scheduling.rows import Row
from vllm_srun.domain.scheduling.scheduler import Scheduler
from vllm_srun.domain.settings.devices import class_limits
from vllm_srun.domain.settings.engine_args import EngineArgs, resolve_limits

GB = 1_000_000_000


def rows(*lengths: int, lane: str = "text", rid: int = 0) -> list[Row]:
    return [Row(rid, i, n, lane, i) for i, n in enumerate(lengths)]


def test_token_accounting() -> None:
    assert round_up(1) == 8 and round_up(8) == 8 and round_up(9) == 16
    assert forward_tokens([3, 17, 9], Accounting.PADDED) == 3 * 24
    assert forward_tokens([3, 17, 9], Accounting.PACKED) == 8 + 24 + 16
    assert forward_tokens([], Accounting.PADDED) == 0


def test_padded_longest_first_and_budgets() -> None:
    batches = plan_lane(rows(5, 40, 12, 33, 7, 6), Accounting.PADDED, max_rows=3, max_tokens=10_000)
    assert [[r.tokens for r in b.rows] for b in batches] == [[40, 33, 12], [7, 6, 5]]
    assert [b.tokens for b in batches] == [3 * 40, 3 * 8]


def test_padded_token_budget_cuts_forwards() -> None:
    batches = plan_lane(rows(30, 30, 30, 10, 10), Accounting.PADDED, max_rows=100, max_tokens=64)
    assert [[r.tokens for r in b.rows] for b in batches] == [[30, 30], [30, 10], [10]]
    assert all(b.tokens <= 64 for b in batches)


def test_packed_keeps_arrival_order() -> None:
    batches = plan_lane(rows(5, 40, 12, 33), Accounting.PACKED, max_rows=8, max_tokens=56)
    assert [[r.tokens for r in b.rows] for b in batches] == [[5, 40], [12, 33]]
    assert [b.tokens for b in batches] == [8 + 40, 16 + 40]  # 8 + 40 + 16 > 56


def test_overlong_row_runs_alone() -> None:
    batches = plan_lane(rows(3, 500, 4), Accounting.PADDED, max_rows=8, max_tokens=64)
    assert [[r.tokens for r in b.rows] for b in batches] == [[500], [4, 3]]


def test_lanes_never_mix_and_cheaper_lane_first() -> None:
    costs = CostModel()
    costs.observe("media", 100, 1.0)  # 10 ms per token
    costs.observe("text", 100, 0.001)
    lanes = {"text": Lane("text"), "media": Lane("media")}
    mixed = rows(10, 10, lane="media") + [Row(1, 0, 10, "text", 5), Row(1, 1, 12, "text", 6)]
    plan = plan_forwards(mixed, lanes, Budget(8, 4096), costs)
    assert [b.lane for b in plan.batches] == ["text", "media"]
    for b in plan.batches:
        assert {r.lane for r in b.rows} == {b.lane}


def test_family_caps_and_batch_invariant_limit() -> None:
    costs = CostModel()
    budget = Budget(256, 65_536)
    assert lane_token_limit(Lane("t", cap_tokens=2048), budget, costs, False) == 2048
    costs.observe("t", 1000, 0.1)  # 1e-4 s/token → 0.3 s = 3000 tokens
    assert lane_token_limit(Lane("t", cap_seconds=0.3), budget, costs, False) == 3000
    assert lane_token_limit(Lane("t"), budget, costs, True) == 512
    assert lane_token_limit(Lane("t"), budget, costs, True, invariant_tokens=265) == 265
    assert lane_token_limit(Lane("t"), budget, costs, False, invariant_tokens=265) == 65_536  # not exact: no cap


def test_an_exact_model_merges_up_to_its_engines_kernel_switch_never_past_512() -> None:
    """R-BAT-5: merged forwards stay on the kernels the probe checked."""
    assert invariant_forward_tokens(None) == BATCH_INVARIANT_TOKENS  # one set of kernels at every size
    assert invariant_forward_tokens(4096) == BATCH_INVARIANT_TOKENS
    assert invariant_forward_tokens(512) == 512
    assert invariant_forward_tokens(265) == 265  # e.g. the oneDNN fast path at one thread
    assert invariant_forward_tokens(MIN_INVARIANT_TOKENS) == MIN_INVARIANT_TOKENS
    assert invariant_forward_tokens(MIN_INVARIANT_TOKENS - 1) is None  # too small to merge: approximate
    assert invariant_forward_tokens(34) is None
    lengths = [60] * 12  # 720 packed tokens
    plan = plan_forwards(
        rows(*lengths),
        {"text": Lane("text")},
        Budget(64, 8192),
        CostModel(),
        batch_invariant=True,
        invariant_tokens=265,
    )
    assert [len(b.rows) for b in plan.batches] == [4, 4, 4]  # a fifth row would pass 265 counted tokens
    assert all(b.tokens <= 265 for b in plan.batches)
    alone = plan_forwards(
        rows(300, 20), {"text": Lane("text")}, Budget(64, 8192), CostModel(), batch_invariant=True, invariant_tokens=265
    )
    assert [len(b.rows) for b in alone.batches] == [1, 1]  # a row past the cap runs alone


@pytest.mark.parametrize("tokens", [7, 513, 4096])
def test_a_scheduler_refuses_a_merged_forward_cap_outside_8_to_512(tokens: int) -> None:
    with pytest.raises(ValueError, match="invariant_tokens"):
        Scheduler([Lane("text")], Budget(8, 4096), window_s=0.0, batch_invariant=True, invariant_tokens=tokens)


def test_unknown_lane_refused() -> None:
    with pytest.raises(ValueError):
        plan_forwards(rows(1, lane="x"), {"text": Lane("text")}, Budget(1, 8), CostModel())


def test_cost_model_ema() -> None:
    c = CostModel(alpha=0.5)
    assert c.seconds_per_token("t") == 2e-5
    c.observe("t", 10, 1.0)
    assert c.seconds_per_token("t") == 0.1
    c.observe("t", 10, 0.0)
    assert c.seconds_per_token("t") == pytest.approx(0.05)


@pytest.mark.parametrize(
    ("kind", "memory", "tokens", "seqs"),
    [
        ("cpu", None, 65_536, 8_192),
        ("mps", None, 65_536, 8_192),
        ("cuda", 192 * GB, 32_768, 256),
        ("cuda", 160 * GB, 32_768, 256),
        ("cuda", 141 * GB, 16_384, 128),
        ("cuda", 64 * GB, 16_384, 128),
        ("cuda", 48 * GB, 8_192, 64),
        ("cuda", 24 * GB, 4_096, 32),
    ],
)
def test_defaults_by_memory_class(kind: str, memory: int | None, tokens: int, seqs: int) -> None:
    limits = class_limits(kind, memory)
    assert (limits.max_num_batched_tokens, limits.max_num_seqs) == (tokens, seqs)


def test_set_values_win_over_class_defaults() -> None:
    r = resolve_limits(EngineArgs(max_num_seqs=4), "cpu", None)
    assert (r.max_num_seqs, r.seqs_source, r.max_num_batched_tokens, r.tokens_source) == (4, "set", 65_536, "class")
    assert EngineArgs(max_num_seqs=0, dtype="fp8").problems() == [
        "max_num_seqs must be >= 1 (got 0)",
        "dtype must be one of auto, float32, bfloat16, float16 (got 'fp8')",
    ]
