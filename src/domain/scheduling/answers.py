"""What the scheduler hands back (`scheduler.py`): a request's `Answer` (its outputs in row order, once its
last row ran), the `EXPIRED` output of a row whose deadline passed before it reached a device
(R-API-10, `Scheduler.expire`), and `Pending`, a request's outputs while its rows run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, final


@final
class Expired:
    """The output of a row whose deadline passed before it reached a device (`Scheduler.expire`)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "EXPIRED"


EXPIRED: Final = Expired()


@dataclass(frozen=True, slots=True)
class Answer:
    request_id: int
    outputs: tuple[Any, ...]  # one per row, in the request's row order


@dataclass(slots=True)
class Pending:
    """A request's rows (how many), its arrival, and the outputs of those done so far."""

    rows: int
    arrival: float
    outputs: list[Any] = field(default_factory=list)
    done: int = 0
