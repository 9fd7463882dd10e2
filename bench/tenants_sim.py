"""Two tenants against the real scheduler on a simulated CPU (issue 23 item 5, R-FAIR-2/5/6):
what the scheduling rules alone give tenant B beside tenant A's flood, without the machine's noise.

The same `Scheduler` that serves requests plans forwards for a fake device with two forward
slots (`--concurrent-forwards 2`, as a 2-CPU worker runs), each forward taking
`overhead + per_token × counted tokens` seconds (defaults measured on the 2-CPU development VM:
a MiniLM forward at one thread costs about 9 ms whatever its size — reading the weights — and
0.18 ms per token more). Tenant A alone keeps 64 requests in progress (`--max-queue`'s default;
its other connections are refused), beside B `--floor` (paced reads hold the rest, R-FAIR-5),
each sent again `--http-ms` after its answer; tenant B sends Poisson arrivals at `--b-share` of
A's alone rate. Rows are 8-24 tokens (the short texts of bench/tenants.py). Prints
A's rate alone and beside B, B's p50/p99 alone (quiet) and beside A, and the ratios the issue
targets (B p99 ÷ quiet ≤ 2, A beside ÷ alone ≥ 0.9), for each floor given. The model has no event
loop: on a real worker the HTTP work shares the CPUs with the forwards, so A's rates (and how much
the floor costs A) are bench/tenants.py's to measure; B's latencies here are what the scheduling
rules leave B once the machine's noise is taken away. The express forward (R-FAIR-7) is not
modelled: it is a third forward sharing two CPUs, which this model (no CPU sharing) would make
free; bench/tenants.py measures it.

    python bench/tenants_sim.py [--seconds 120] [--floor 16,32] [--b-share 0.1]
"""

from __future__ import annotations

import argparse
import heapq
import random
from dataclasses import dataclass, field

from vllm_srun.domain.scheduling.lanes import Accounting, Lane
from vllm_srun.domain.scheduling.planning import Budget, ForwardBatch
from vllm_srun.domain.scheduling.rows import RowSpec
from vllm_srun.domain.scheduling.scheduler import Scheduler


@dataclass
class Device:
    overhead_s: float
    per_token_s: float

    def seconds(self, batch: ForwardBatch) -> float:
        return self.overhead_s + self.per_token_s * batch.tokens


@dataclass
class Outcome:
    a_rate: float
    b_latencies: list[float] = field(default_factory=list)

    def b_ms(self, q: float) -> float:
        xs = sorted(self.b_latencies)
        return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000 if xs else 0.0


def simulate(device: Device, *, floor: int, b_rate: float, http_s: float, seconds: float, seed: int) -> Outcome:
    """A closed loop of FLOOR requests of tenant A and Poisson arrivals of B at B_RATE per second."""
    rng = random.Random(seed)
    # MiniLM on the CPU: merged forwards of a batch-invariant model hold at most 512 counted tokens
    scheduler = Scheduler(
        [Lane("text", Accounting.PACKED, cap_tokens=4096)],
        Budget(8192, 65536),
        window_s=0.0,
        batch_invariant=True,
        invariant_tokens=512,
        max_in_flight=2,
    )
    events: list[tuple[float, int, str, object]] = []
    order = 0

    def at(when: float, kind: str, data: object) -> None:
        nonlocal order
        order += 1
        heapq.heappush(events, (when, order, kind, data))

    for _ in range(floor):
        at(rng.uniform(0, 0.05), "arrive", "A")
    when = 0.0
    while b_rate > 0 and when < seconds:
        when += rng.expovariate(b_rate)
        at(when, "arrive", "B")
    sent: dict[int, tuple[str, float]] = {}
    outcome = Outcome(0.0)
    a_answered = 0
    while events:
        now, _, kind, data = heapq.heappop(events)
        if now > seconds:
            break
        if kind == "arrive":
            tenant = str(data)
            rid = scheduler.submit([RowSpec(rng.randint(8, 24), "text")], now, tenant=tenant)
            sent[rid] = (tenant, now)
        else:
            assert isinstance(data, ForwardBatch)
            for answer in scheduler.complete(data, [None] * len(data.rows)):
                tenant, arrived = sent.pop(answer.request_id)
                if tenant == "A":
                    a_answered += 1
                    at(now + http_s, "arrive", "A")
                else:
                    outcome.b_latencies.append(now + http_s - arrived)
        while (batch := scheduler.next_forward(now)) is not None:
            at(now + device.seconds(batch), "done", batch)
    outcome.a_rate = a_answered / seconds
    return outcome


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=120.0, help="simulated seconds per case (default: %(default)g)")
    p.add_argument("--floor", default="16,32", help="A's requests in progress, comma-separated (default: %(default)s)")
    p.add_argument("--b-share", type=float, default=0.1, help="B's rate ÷ A's alone rate (default: %(default)g)")
    p.add_argument("--overhead-ms", type=float, default=9.0, help="a forward's fixed cost (default: %(default)g)")
    p.add_argument("--per-token-ms", type=float, default=0.18, help="a counted token's cost (default: %(default)g)")
    p.add_argument("--http-ms", type=float, default=5.0, help="A's turnaround between answer and next request")
    p.add_argument("--max-queue", type=int, default=64, help="A's requests in progress alone (default: %(default)d)")
    p.add_argument("--seed", type=int, default=1)
    ns = p.parse_args()
    device = Device(ns.overhead_ms / 1000, ns.per_token_ms / 1000)
    common = dict(http_s=ns.http_ms / 1000, seconds=ns.seconds, seed=ns.seed)
    for floor in (int(x) for x in ns.floor.split(",")):
        alone = simulate(device, floor=ns.max_queue, b_rate=0.0, **common)
        b_rate = ns.b_share * alone.a_rate
        quiet = simulate(device, floor=0, b_rate=b_rate, **common)
        both = simulate(device, floor=floor, b_rate=b_rate, **common)
        print(
            f"floor {floor:3d}: A alone {alone.a_rate:6.1f}/s, beside B {both.a_rate:6.1f}/s "
            f"(÷ alone {both.a_rate / alone.a_rate:.2f}, target >= 0.9); "
            f"B {b_rate:.1f}/s quiet p50/p99 {quiet.b_ms(0.5):.1f}/{quiet.b_ms(0.99):.1f} ms, "
            f"beside A {both.b_ms(0.5):.1f}/{both.b_ms(0.99):.1f} ms "
            f"(p99 ÷ quiet {both.b_ms(0.99) / quiet.b_ms(0.99):.2f}, target <= 2)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
