"""Who asks least, and the tenant express (R-FAIR-6, R-FAIR-7).

A tenant's ask is its counted tokens (`fairness.row_cost`) for its weight. `least_asking` names the
tenants asking least among some of them (ties: all of them) and whether another asks more: a fair
round ends once the rows of the lightest backlogged tenants are in it (R-FAIR-6, `Scheduler`'s
rounds). `lightest_holding` counts what a tenant has running too, so a flood whose queued rows the
busy slots have just taken is still the flood; `tenant_express_forward` gives the tenants it names
their next turn early, on the express forward beside the busy slots (R-FAIR-7,
`Scheduler.next_express`), the others keeping their places and credit in the ring.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from vllm_srun.domain.scheduling.fairness import FairQueue, row_cost
from vllm_srun.domain.scheduling.planning import ForwardBatch
from vllm_srun.domain.scheduling.rows import Row


def least_asking(
    asks: Mapping[str, int], among: frozenset[str], weight: Callable[[str], float]
) -> tuple[frozenset[str], bool]:
    """Of AMONG, the tenants whose ASKS (counted tokens) are least for their WEIGHT (ties: all of
    them), and whether a tenant of ASKS asks more for its weight than they do."""
    weighed = {name: ask / weight(name) for name, ask in asks.items()}
    least = min((weighed[name] for name in among), default=None)
    if least is None:
        return frozenset(), False
    return frozenset(name for name in among if weighed[name] == least), max(weighed.values()) > least


def lightest_holding(
    queue: FairQueue, running: Iterable[ForwardBatch], weight: Callable[[str], float]
) -> frozenset[str]:
    """The tenants with rows in QUEUE that ask least for their WEIGHT, counting their rows RUNNING too
    (counted tokens queued and running ÷ weight; ties: all of them), when another tenant holding work
    asks more; nobody otherwise (one tenant, or equal floods)."""
    queued = queue.tenants()
    asks = {name: queue.tokens_of(name) for name in queued}
    for batch in running:
        for row in batch.rows:
            asks[row.tenant] = asks.get(row.tenant, 0) + row_cost(row)
    least, others_ask_more = least_asking(asks, queued, weight)
    return least if others_ask_more else frozenset()


def tenant_express_forward(
    queue: FairQueue,
    running: Iterable[ForwardBatch],
    weight: Callable[[str], float],
    quantum: float,
    room: Callable[[Row], bool],
    batches: Callable[[Sequence[Row]], tuple[ForwardBatch, ...]],
) -> ForwardBatch | None:
    """R-FAIR-7: a forward of the rows of the tenant asking least (`lightest_holding`) when another
    tenant holding work asks more: its next turn had early (`FairQueue.take_ahead` with QUANTUM and
    the round's ROOM; the others keep their places and credit), planned by BATCHES, the rest back in
    QUEUE. None when nobody is lighter, or it had that turn early already (its rows wait for its
    place in the ring)."""
    light = lightest_holding(queue, running, weight)
    if not light:
        return None
    planned = batches(queue.take_ahead(light, quantum, room))
    if not planned:
        return None
    queue.restore(r for b in planned[1:] for r in b.rows)
    return planned[0]
