"""Load retries (R-LOAD-1): how often a model that failed to load is tried again, and when.

A failure is *transient* or *final*; which one an error is belongs to the adapter that saw it
(`adapters/serving/load_failures.py`: a file still being written, a device busy or out of
memory). A final failure (the package, the golden check, a missing capability) ends the model at
once. A transient one is tried again while attempts are left (`--load-attempts`, counting the
first), after `--load-retry-seconds`, doubling after each failure, never more than the cap
(`bounds.LOAD_RETRY_CAP_S`, 300 s).

While a model waits, `/health` and its card say which attempt failed, when the next one starts
and why (`waiting_reason`): `loading (attempt 2 of 5, next in 10 s): OSError: …`; while the next
runs, which one it is (`attempt_reason`); a model that ends failed says after how many
(`final_reason`).

Pure: counts, seconds and strings in, seconds or None out; the caller sleeps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from vllm_srun.domain.settings import bounds


@dataclass(frozen=True, slots=True)
class LoadRetryPolicy:
    """ATTEMPTS loads at most (the first included); the wait after the Nth failure is
    FIRST_DELAY_S × 2^(N-1), at most CAP_S."""

    attempts: int = bounds.LOAD_ATTEMPTS.default
    first_delay_s: float = bounds.LOAD_RETRY_SECONDS.default
    cap_s: float = bounds.LOAD_RETRY_CAP_S

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"load attempts must be >= 1 (got {self.attempts})")
        if not 0 <= self.first_delay_s <= self.cap_s:
            raise ValueError(f"the first load retry delay must be between 0 and {self.cap_s:g} s")

    def delay_after(self, failed: int) -> float:
        """Seconds between the FAILED-th attempt (1-based) and the next one."""
        if failed < 1:
            raise ValueError(f"attempts are counted from 1 (got {failed})")
        if self.first_delay_s == 0:
            return 0.0
        # 2 ** 1000 times any first delay is finite (and past the cap): no float overflow
        return min(self.cap_s, self.first_delay_s * 2.0 ** min(failed - 1, 1000))

    def next_delay(self, failed: int, transient: bool) -> float | None:
        """After the FAILED-th attempt failed: the seconds until the next attempt, or None when
        the failure is final (not TRANSIENT, or no attempt left)."""
        if not transient or failed >= self.attempts:
            return None
        return self.delay_after(failed)

    def schedule(self) -> tuple[float, ...]:
        """Every wait a model that always fails transiently goes through, in order."""
        return tuple(self.delay_after(failed) for failed in range(1, self.attempts))


def waiting_reason(failed: int, attempts: int, seconds_left: float, why: str) -> str:
    """What `/health` and the card say while a model waits for its next attempt: the attempt
    that failed, out of how many, the whole seconds until the next (rounded up), and why."""
    left = max(0, math.ceil(seconds_left - 1e-9))
    return f"loading (attempt {failed} of {attempts}, next in {left} s): {why}"


def attempt_reason(attempt: int, attempts: int, last_why: str) -> str:
    """What they say while a later attempt (ATTEMPT > 1) runs: which one, and why the last failed."""
    return f"loading (attempt {attempt} of {attempts}; the last one failed: {last_why})"


def final_reason(failed: int, attempts: int, why: str, transient: bool) -> str:
    """The reason a model that will not be tried again fails with: WHY alone when the failure was
    final, else with the attempts it took."""
    if not transient or attempts == 1:
        return why
    return f"{why} (after {failed} attempts)"
