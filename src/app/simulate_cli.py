"""`vllm-srun simulate`: replay a synthetic load or a trace against a device cost model (R-BAT-8).

Trace file: JSON lines `{"t": seconds, "rows": [tokens, …]}`.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from pathlib import Path

from vllm_srun.domain.scheduling.lanes import Accounting, Lane
from vllm_srun.domain.scheduling.planning import Budget
from vllm_srun.domain.scheduling.simulation import DeviceModel, TraceRequest, simulate, synthetic_trace


def add_parser(sub: argparse._SubParsersAction, positive_int, window_ms) -> None:
    p = sub.add_parser("simulate", help="replay a load against a device cost model with the real scheduler")
    p.add_argument(
        "--trace",
        type=Path,
        default=None,
        help='JSON lines {"t": s, "rows": [tokens…]} to replay (default: a synthetic load)',
    )
    p.add_argument("--requests", type=positive_int, default=2000, help="synthetic requests (default: %(default)s)")
    p.add_argument(
        "--rate", type=_number_above(0.0), default=500.0, help="synthetic arrivals per second (default: %(default)g)"
    )
    p.add_argument(
        "--rows-per-request", type=positive_int, default=1, help="rows of a synthetic request (default: %(default)s)"
    )
    p.add_argument(
        "--min-tokens", type=positive_int, default=4, help="fewest tokens of a synthetic row (default: %(default)s)"
    )
    p.add_argument(
        "--max-tokens", type=positive_int, default=64, help="most tokens of a synthetic row (default: %(default)s)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic load (default: %(default)s)")
    p.add_argument(
        "--max-num-seqs", type=positive_int, default=256, help="most rows in one forward (default: %(default)s)"
    )
    p.add_argument(
        "--max-num-batched-tokens",
        type=positive_int,
        default=8192,
        help="most counted tokens in one forward (default: %(default)s)",
    )
    p.add_argument(
        "--batch-window-ms",
        type=window_ms,
        default=2.0,
        help="milliseconds the first queued row waits for company (default: %(default)g)",
    )
    p.add_argument(
        "--accounting",
        choices=["padded", "packed"],
        default="padded",
        help="how a forward's tokens are counted (default: %(default)s)",
    )
    p.add_argument(
        "--overhead-ms",
        type=_number_above(-1e-12),
        default=2.0,
        help="device time of an empty forward (default: %(default)g)",
    )
    p.add_argument(
        "--us-per-token",
        type=_number_above(-1e-12),
        default=20.0,
        help="device time per counted token (default: %(default)g)",
    )


def _number_above(low: float) -> Callable[[str], float]:
    """An argparse type: a finite number above LOW, refused in one line otherwise."""

    def convert(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not low < value < float("inf"):
            raise argparse.ArgumentTypeError(f"expected a finite number {'> 0' if low >= 0 else '>= 0'}, got {text}")
        return value

    return convert


def load_trace(path: Path) -> list[TraceRequest]:
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            item = json.loads(line)
            rows = tuple(int(x) for x in item["rows"])
            if not rows or min(rows) < 1:
                raise ValueError(f"{path}:{n}: rows must be positive token counts")
            out.append(TraceRequest(float(item["t"]), rows))
    return out


def run(ns: argparse.Namespace) -> int:
    if ns.trace is not None:
        trace = load_trace(ns.trace)
    else:
        if ns.min_tokens > ns.max_tokens or ns.rate <= 0:
            raise ValueError("--min-tokens must be <= --max-tokens and --rate > 0")
        trace = synthetic_trace(
            random.Random(ns.seed),
            requests=ns.requests,
            rate_rps=ns.rate,
            rows_per_request=ns.rows_per_request,
            min_tokens=ns.min_tokens,
            max_tokens=ns.max_tokens,
        )
    report = simulate(
        trace,
        lane=Lane("text", Accounting(ns.accounting)),
        budget=Budget(ns.max_num_seqs, ns.max_num_batched_tokens),
        window_s=ns.batch_window_ms / 1000,
        device=DeviceModel(ns.overhead_ms / 1000, ns.us_per_token / 1e6),
    )
    print(
        f"requests {report.requests}  rows {report.rows}  forwards {report.forwards}  "
        f"rows/forward {report.rows / max(report.forwards, 1):.1f}  fill {report.fill_ratio:.2f}"
    )
    print(
        f"throughput {report.throughput_rps:.1f} req/s  p50 {report.percentile_ms(0.5):.2f} ms  "
        f"p99 {report.percentile_ms(0.99):.2f} ms  makespan {report.makespan_s:.3f} s"
    )
    return 0
