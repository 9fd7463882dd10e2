"""Lanes (R-BAT-6) and their token accounting (R-BAT-2) and family caps (R-BAT-7).

Rows of different lanes never share a forward. Each lane says how its forwards are counted:
*padded* (rows × longest row, the longest rounded up to a multiple of 8) or *packed* (sum of
rows, each rounded up to 8), and may carry a family cap in padded tokens or device seconds.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

TOKEN_ALIGN = 8


class Accounting(enum.Enum):
    PADDED = "padded"
    PACKED = "packed"


def round_up(n: int, multiple: int = TOKEN_ALIGN) -> int:
    return -(-n // multiple) * multiple


def forward_tokens(lengths: Iterable[int], accounting: Accounting) -> int:
    """Tokens a forward of rows with these lengths counts against the budget."""
    lengths = list(lengths)
    if not lengths:
        return 0
    if accounting is Accounting.PADDED:
        return len(lengths) * round_up(max(lengths))
    return sum(round_up(n) for n in lengths)


@dataclass(frozen=True, slots=True)
class Lane:
    name: str
    accounting: Accounting = Accounting.PADDED
    cap_tokens: int | None = None  # family cap in counted tokens (e.g. 2,048 on a CPU)
    cap_seconds: float | None = None  # family cap in device seconds at the lane's EMA cost

    def __post_init__(self) -> None:
        if self.cap_tokens is not None and self.cap_tokens < TOKEN_ALIGN:
            raise ValueError(f"lane {self.name}: cap_tokens must be >= {TOKEN_ALIGN}")
        if self.cap_seconds is not None and self.cap_seconds <= 0:
            raise ValueError(f"lane {self.name}: cap_seconds must be > 0")
