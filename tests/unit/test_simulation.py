from __future__ import annotations

import pytest

from tests.fakes import FakeRng
from vllm_srun.domain.scheduling.lanes import Lane
from vllm_srun.domain.scheduling.planning import Budget
from vllm_srun.domain.scheduling.simulation import DeviceModel, TraceRequest, simulate, synthetic_trace


def test_lone_request_pays_window_plus_forward() -> None:
    report = simulate(
        [TraceRequest(0.0, (10,))],
        lane=Lane("text"),
        budget=Budget(8, 1024),
        window_s=0.002,
        device=DeviceModel(overhead_s=0.001, per_token_s=1e-4),
    )
    assert report.forwards == 1
    assert report.latencies_s[0] == pytest.approx(0.002 + 0.001 + 16 * 1e-4)


def test_batching_beats_one_row_per_forward_under_load() -> None:
    trace = synthetic_trace(FakeRng(1), requests=400, rate_rps=2000, rows_per_request=1, min_tokens=4, max_tokens=24)
    device = DeviceModel(overhead_s=0.004, per_token_s=5e-6)
    batched = simulate(trace, lane=Lane("text"), budget=Budget(256, 8192), window_s=0.002, device=device)
    single = simulate(trace, lane=Lane("text"), budget=Budget(1, 8192), window_s=0.002, device=device)
    assert batched.requests == single.requests == 400
    assert len(batched.latencies_s) == len(single.latencies_s) == 400  # every request answered once
    assert batched.forwards < single.forwards == 400
    assert batched.throughput_rps > 3 * single.throughput_rps
    assert batched.percentile_ms(0.99) < single.percentile_ms(0.99)


def test_trace_is_deterministic_for_a_seed() -> None:
    a = synthetic_trace(FakeRng(7), requests=20, rate_rps=10, rows_per_request=3, min_tokens=1, max_tokens=9)
    b = synthetic_trace(FakeRng(7), requests=20, rate_rps=10, rows_per_request=3, min_tokens=1, max_tokens=9)
    assert a == b and all(1 <= n <= 9 for r in a for n in r.rows)


def test_simulate_cli(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from vllm_srun.app.cli import main

    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"t": 0, "rows": [5, 9]}\n{"t": 0.001, "rows": [30]}\n')
    assert main(["simulate", "--trace", str(trace), "--overhead-ms", "1", "--us-per-token", "10"]) == 0
    out = capsys.readouterr().out
    assert "requests 2  rows 3  forwards 1" in out
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "--trace", str(tmp_path / "missing.jsonl")])
    assert exc.value.code == 2
