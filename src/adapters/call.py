"""One request as the serving core sees it (`Call`): who sent it, how urgent it is, how large its
body was, how to tell that its client went away, where its timing goes, and whether it is the
golden check's replay (R-CALL-1).

The HTTP handler builds it once from what the transport tells (tenant, body size, the
disconnect waiter, the timing of `request_timing.py`) and the model it resolved; `answer`
(`surfaces/common.py`) gives it the priority and deadline the request's options ask for;
admission gives it the ticket it holds (`ServedModel.admitted`). It goes by argument to the
surface, the served model and the scheduler loop, never through a context variable. The golden
check replays its recorded requests with `REPLAY` (`Call(replay=True)`); a bundle gives each task
a copy with the task's own size.

It is a frozen record with no behaviour: a step that learns something makes a copy
(`dataclasses.replace`). The one mutable part is the timing it refers to (`RequestTiming`:
phases marked as they happen).
It lives among the adapters, not in the domain, because it carries the disconnect waiter (I/O)
and the timing (clock reads).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from vllm_srun.adapters.request_timing import RequestTiming
from vllm_srun.domain.scheduling.admission import Admission, Ticket
from vllm_srun.domain.scheduling.tenants import DEFAULT_TENANT, Priority

# waits until the request's client has gone away (the HTTP adapter's `wait_disconnect`)
Disconnected = Callable[[], Awaitable[object]]


@dataclass(frozen=True, slots=True)
class Held:
    """The admission ticket a call holds, with the model's admission that gave it (R-ADM-1):
    the rows it runs on that model are counted into it."""

    admission: Admission
    ticket: Ticket


@dataclass(frozen=True, slots=True)
class Call:
    tenant: str = DEFAULT_TENANT  # whose request it is (`http/auth.py`): its rows are scheduled for it (R-FAIR-1)
    priority: Priority | None = None  # `options.priority` (R-FAIR-3); None: the scheduler's choice
    deadline_ms: float | None = None  # `options.deadline_ms`, from its arrival (R-API-10)
    body_bytes: int = 0  # its body's plain size: what decides where it is prepared (`adapters/offload.py`)
    disconnected: Disconnected | None = None  # None: no client to lose (the golden check, a test)
    timing: RequestTiming | None = None  # its phases (`Server-Timing`, traces); None: untimed
    model: str = ""  # the name of the model it was resolved to (metrics, logs)
    replay: bool = False  # the golden check's replay (R-GOLD-1): warming answers, no cache, no input budget
    held: Held | None = None  # the admission ticket it holds, once admitted


REPLAY = Call(replay=True)  # the golden check's (and the golden recorder's) call
