"""Adaptive forward threads (R-CPU-2): learn, per forward size, the fastest intra-op thread count
from timed *shadow* forwards that must reproduce the served answer bit for bit.

`VLLM_SRUN_CPU_ADAPTIVE_THREADS` (parsed by `parse_mode` through `bounds.CPU_ADAPTIVE_THREADS`):
`0` off; `1` learn and report (every answer comes from the configured count); `2` also serve a
size bucket's learned count once every candidate's shadows reproduced the served answers there.

The rules, all in `ThreadLearner`:
- nothing is explored before the golden check passed (`golden_passed`); then one warm-up rerun at
  the configured count (untimed; its bits must equal the served answer's, so caches and lazily
  built kernels are out of the comparison) before any shadow;
- a forward gets at most one shadow: the candidate count of its size bucket with the fewest
  timings, until each candidate has `samples` of them; the served forward's own time counts for
  the count it ran at;
- the first shadow whose bits differ from the served answer (drift) stops learning for good: the
  learner then serves the configured count and plans no shadow, ever;
- exploration ends when the learning window (`window_s` from the warm-up) closes; the table is
  then frozen;
- a bucket's learned count is the candidate with the lowest median seconds per token, preferred
  over the configured count only when it is at least `margin` faster (timings on a shared host
  move by a few percent).

Pure: timings, clock readings and bit comparisons come in as numbers and booleans from the
adapter (`adapters/serving/forward_threads.py`).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from typing import Any

from vllm_srun.domain.settings import bounds

ADAPTIVE_ENV = "VLLM_SRUN_CPU_ADAPTIVE_THREADS"
BUCKET_EDGES = (64, 256, 1024, 4096)  # forward tokens: [0, 64), [64, 256), …, [4096, ∞)
DEFAULT_SAMPLES = 5
DEFAULT_WINDOW_S = 600.0
DEFAULT_MARGIN = 0.03


class Mode(IntEnum):
    OFF = 0
    LEARN = 1
    SERVE = 2


class Phase(StrEnum):
    OFF = "off"
    WAITING = "waiting_for_golden"
    WARMING = "warming"
    LEARNING = "learning"
    LEARNED = "learned"
    STOPPED = "stopped"


def parse_mode(text: str | None) -> Mode:
    """The mode `VLLM_SRUN_CPU_ADAPTIVE_THREADS` asks for (unset or blank: off); ValueError with
    one line naming the variable otherwise."""
    if text is None or not text.strip():
        return Mode.OFF
    try:
        return Mode(int(bounds.CPU_ADAPTIVE_THREADS.parse(text.strip())))
    except ValueError as exc:
        raise ValueError(f"{ADAPTIVE_ENV}: {exc}") from None


def candidate_counts(configured: int, budget: int) -> tuple[int, ...]:
    """The counts a learner may try: 1, the powers of two below the budget, the configured count
    and the budget itself (never above the budget)."""
    if configured < 1 or budget < 1:
        raise ValueError(f"thread counts must be >= 1, got configured {configured}, budget {budget}")
    top = max(budget, configured)
    counts = {1, configured, top}
    power = 2
    while power < top:
        counts.add(power)
        power *= 2
    return tuple(sorted(counts))


def bucket_of(tokens: int) -> int:
    """The size bucket of a forward of TOKENS counted tokens (an index into `bucket_label`)."""
    for index, edge in enumerate(BUCKET_EDGES):
        if tokens < edge:
            return index
    return len(BUCKET_EDGES)


def bucket_label(index: int) -> str:
    low = BUCKET_EDGES[index - 1] if index > 0 else 0
    if index >= len(BUCKET_EDGES):
        return f"{low}+"
    return f"{low}-{BUCKET_EDGES[index] - 1}"


@dataclass(frozen=True, slots=True)
class ThreadPlan:
    """How one forward runs: the count its answer comes from, whether a warm-up rerun at the
    configured count follows it, and the shadow counts to time and compare after it."""

    serve: int
    shadows: tuple[int, ...] = ()
    warm_up: bool = False


@dataclass(slots=True)
class BucketStats:
    """Seconds per token of each count's forwards in one size bucket."""

    timings: dict[int, list[float]] = field(default_factory=dict)

    def add(self, count: int, per_token_s: float) -> None:
        self.timings.setdefault(count, []).append(per_token_s)

    def samples(self, count: int) -> int:
        return len(self.timings.get(count, ()))

    def median(self, count: int) -> float | None:
        found = self.timings.get(count)
        return statistics.median(found) if found else None


class ThreadLearner:
    """One model's adaptive-thread learner (module doc). Not thread-safe: the device thread owns it."""

    def __init__(
        self,
        mode: Mode,
        configured: int,
        candidates: tuple[int, ...],
        *,
        samples: int = DEFAULT_SAMPLES,
        window_s: float = DEFAULT_WINDOW_S,
        margin: float = DEFAULT_MARGIN,
    ) -> None:
        if configured not in candidates:
            raise ValueError(f"the configured count {configured} is not among the candidates {candidates}")
        if samples < 1 or window_s <= 0 or not 0 <= margin < 1:
            raise ValueError(f"bad learner settings: samples {samples}, window_s {window_s}, margin {margin}")
        self.mode = mode
        self.configured = configured
        self.candidates = candidates
        self.samples = samples
        self.window_s = window_s
        self.margin = margin
        self.phase = Phase.OFF if mode is Mode.OFF or len(candidates) < 2 else Phase.WAITING
        self.reason: str | None = "one candidate count: nothing to learn" if len(candidates) < 2 else None
        self.buckets: dict[int, BucketStats] = {}
        self.shadows_run = 0
        self.window_ends: float | None = None

    # ---- lifecycle ----------------------------------------------------------------------------
    def golden_passed(self) -> None:
        """The golden check matched: the next forward is the warm-up rerun."""
        if self.phase is Phase.WAITING:
            self.phase = Phase.WARMING

    def golden_not_passed(self, status: str) -> None:
        """The golden check ended otherwise (unverified, failed): nothing is ever explored."""
        if self.phase is Phase.WAITING:
            self.phase = Phase.STOPPED
            self.reason = f"the golden check did not pass ({status}); nothing explored"

    @property
    def exploring(self) -> bool:
        return self.phase in (Phase.WARMING, Phase.LEARNING)

    def _close_window(self, now: float) -> None:
        if self.phase is Phase.LEARNING and self.window_ends is not None and now >= self.window_ends:
            self.phase = Phase.LEARNED
            self.reason = f"learning window of {self.window_s:g} s closed"

    # ---- per forward --------------------------------------------------------------------------
    def plan(self, tokens: int, now: float) -> ThreadPlan:
        self._close_window(now)
        serve = self.serving_count(tokens)
        if self.phase is Phase.WARMING:
            return ThreadPlan(serve, warm_up=True)
        if self.phase is not Phase.LEARNING:
            return ThreadPlan(serve)
        stats = self.buckets.get(bucket_of(tokens), BucketStats())
        wanting = [c for c in self.candidates if c != serve and stats.samples(c) < self.samples]
        if not wanting:
            return ThreadPlan(serve)
        fewest = min(wanting, key=lambda c: (stats.samples(c), c))
        return ThreadPlan(serve, shadows=(fewest,))

    def warmed_up(self, matched: bool, now: float) -> None:
        """The warm-up rerun ran: learning starts (its window opens), or stops when even the
        configured count did not reproduce its own answer."""
        if self.phase is not Phase.WARMING:
            return
        if not matched:
            self.stop(f"the configured count ({self.configured}) did not reproduce its own answer")
            return
        self.phase = Phase.LEARNING
        self.window_ends = now + self.window_s

    def served(self, tokens: int, count: int, seconds: float) -> None:
        """The served forward's time counts for its own count while learning."""
        if self.phase is Phase.LEARNING:
            self._record(tokens, count, seconds)

    def shadow(self, tokens: int, count: int, seconds: float, matched: bool) -> None:
        """A shadow ran: its time is recorded, or, when its bits differed, learning stops for good."""
        if not self.exploring:
            return
        self.shadows_run += 1
        if not matched:
            self.stop(
                f"drift: {count} thread(s) gave other bits than the served answer on a forward of {tokens} tokens"
            )
            return
        self._record(tokens, count, seconds)

    def _record(self, tokens: int, count: int, seconds: float) -> None:
        self.buckets.setdefault(bucket_of(tokens), BucketStats()).add(count, seconds / max(tokens, 1))

    def stop(self, reason: str) -> None:
        """Learning stops for good: the configured count serves, no shadow runs again."""
        self.phase = Phase.STOPPED
        self.reason = reason

    # ---- answers ------------------------------------------------------------------------------
    def learned(self, bucket: int) -> int | None:
        """A bucket's fastest count once every candidate has its samples; None before."""
        stats = self.buckets.get(bucket)
        if stats is None or any(stats.samples(c) < self.samples for c in self.candidates):
            return None
        medians = {c: stats.median(c) or 0.0 for c in self.candidates}
        best = min(self.candidates, key=lambda c: (medians[c], c))
        if medians[best] > medians[self.configured] * (1 - self.margin):
            return self.configured  # not clearly faster: keep the configured count
        return best

    def serving_count(self, tokens: int) -> int:
        """The count a forward of TOKENS tokens is answered at."""
        if self.mode is not Mode.SERVE or self.phase not in (Phase.LEARNING, Phase.LEARNED):
            return self.configured
        learned = self.learned(bucket_of(tokens))
        return self.configured if learned is None else learned

    def table(self) -> dict[str, Any]:
        """The card's `threads.adaptive` entry."""
        buckets = []
        for index in sorted(self.buckets):
            stats = self.buckets[index]
            medians = {str(c): stats.median(c) for c in self.candidates if stats.samples(c)}
            buckets.append(
                {
                    "tokens": bucket_label(index),
                    "samples": {str(c): stats.samples(c) for c in self.candidates},
                    "median_us_per_token": {c: round(m * 1e6, 3) for c, m in medians.items() if m is not None},
                    "learned": self.learned(index),
                }
            )
        return {
            "mode": int(self.mode),
            "phase": self.phase.value,
            "reason": self.reason,
            "candidates": list(self.candidates),
            "samples_per_count": self.samples,
            "window_s": self.window_s,
            "shadows_run": self.shadows_run,
            "buckets": buckets,
        }
