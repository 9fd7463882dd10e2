"""Which kernels serve a forward (R-DT-3): faster kernels only where they were measured faster.

An engine with a faster path (e.g. oneDNN pre-packed linears on an x86 CPU) times it against the
reference (eager) kernels at load, on the same inputs, over a grid of forward sizes in tokens
(rows × padded length). `plan_kernels` turns those timings into a `KernelPlan`: the fast path
serves every forward up to the largest measured size at which it, *and every smaller measured
size*, was at least `min_speedup` times faster than eager. Past that size, past the largest size
measured, or from the first size where it lost, the reference kernels serve. One contiguous
region from 0 keeps the choice monotone in the forward's size, so the kernels a row runs on
change at most once (at `fast_up_to`), which is what the batch-invariance argument needs: a
batch-invariant model's merged forwards stay within 512 padded tokens (R-BAT-5), so a fast path
that is itself batch-invariant keeps the model exact only if it serves every forward up to 512.
Where the fast path is at most 10 % slower up to 512 (`DEFAULT_TIE`), the plan gives exactness the
benefit (`exact_tokens`).

Pure: timings in (medians, measured by an adapter), a plan out. No clock, no torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# a fast path must win by this factor at a size to serve it: a tie is noise, not a gain
DEFAULT_MIN_SPEEDUP = 1.03
# ... and up to R-BAT-5's 512 tokens, within this factor it still serves (`exact_tokens`): a model
# whose merged forwards stay on one set of batch-invariant kernels is exact, has no batch window and
# merges up to 512 tokens, which gains more than a slightly slower kernel loses. Measured with `wrk`
# on 2 CPUs (MiniLM, two concurrent one-thread forwards, whose linears timed 0.94x eager at 529
# tokens): every forward packed and merged to 512 served 1.22x the short and 1.02x the mixed requests
# of packed forwards stopped at 265 tokens (bench/peers.py, `--deterministic` forces the former).
DEFAULT_TIE = 0.90


@dataclass(frozen=True, slots=True)
class KernelTiming:
    """Median seconds of the same forward (or its linear layers) on both paths at one size."""

    tokens: int
    eager_s: float
    fast_s: float

    @property
    def speedup(self) -> float:
        """eager ÷ fast: above 1 the fast path is faster."""
        if self.fast_s <= 0:
            return float("inf") if self.eager_s > 0 else 1.0
        return self.eager_s / self.fast_s


@dataclass(frozen=True, slots=True)
class KernelPlan:
    """Forwards of at most `fast_up_to` tokens take the fast path; 0 means never."""

    fast_up_to: int = 0

    def use_fast(self, tokens: int) -> bool:
        return 0 < tokens <= self.fast_up_to

    @property
    def enabled(self) -> bool:
        return self.fast_up_to > 0

    def covers(self, tokens: int) -> bool:
        """True when every forward of up to TOKENS tokens takes the fast path."""
        return self.fast_up_to >= tokens


def _prefix(timings: list[KernelTiming], min_speedup: float) -> int:
    fast_up_to = 0
    for timing in timings:
        if timing.speedup < min_speedup:
            break
        fast_up_to = timing.tokens
    return fast_up_to


def plan_kernels(
    timings: Iterable[KernelTiming],
    min_speedup: float = DEFAULT_MIN_SPEEDUP,
    *,
    exact_tokens: int | None = None,
    tie: float = DEFAULT_TIE,
) -> KernelPlan:
    """The largest measured size up to which the fast path won at every measured size (module doc).

    EXACT_TOKENS (R-BAT-5's 512): when the fast path won at the small sizes and was *not measurably
    slower* (speedup >= TIE) at every size measured up to EXACT_TOKENS, it serves every forward up
    to EXACT_TOKENS, so a model whose fast path is batch-invariant can be served as such; speed
    alone still decides past EXACT_TOKENS.
    """
    if min_speedup <= 0 or tie <= 0:
        raise ValueError(f"min_speedup and tie must be > 0, got {min_speedup}, {tie}")
    ordered = sorted(timings, key=lambda t: t.tokens)
    if any(t.tokens < 1 for t in ordered):
        raise ValueError("a timing below 1 token")
    fast_up_to = _prefix(ordered, min_speedup)
    if (
        exact_tokens is not None
        and 0 < fast_up_to < exact_tokens
        and _prefix(ordered, min(tie, min_speedup)) >= exact_tokens
    ):
        fast_up_to = exact_tokens
    return KernelPlan(fast_up_to)


def timing_grid(largest: int, smallest: int = 16, factor: int = 2) -> tuple[int, ...]:
    """Sizes to time: SMALLEST, then × FACTOR while below LARGEST, then LARGEST itself."""
    if largest < 1 or factor < 2:
        raise ValueError(f"need largest >= 1 and factor >= 2, got {largest}, {factor}")
    sizes: list[int] = []
    size = max(1, smallest)
    while size < largest:
        sizes.append(size)
        size *= factor
    sizes.append(largest)
    return tuple(sizes)


def bucket_rows(rows: int, exact_up_to: int = 16, steps_per_octave: int = 16, align: int = 8) -> int:
    """The row count a packed kernel runs for ROWS rows (the rest are zero padding): at least 2,
    exact up to EXACT_UP_TO, then rounded up to a multiple of ALIGN and to one of
    STEPS_PER_OCTAVE sizes per doubling.

    Kernels that build a primitive per input shape (oneDNN) then see a bounded set of shapes
    (about 110 up to 4,096 rows with the defaults), each a multiple of ALIGN (no ragged row
    blocks), at a padding cost under 1/STEPS_PER_OCTAVE (about half that on average).
    """
    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    if steps_per_octave < 1 or align < 1:
        raise ValueError(f"steps_per_octave and align must be >= 1, got {steps_per_octave}, {align}")
    if rows <= max(2, exact_up_to):
        return max(2, rows)
    octave = 1 << (rows - 1).bit_length() - 1  # the power of two just below ROWS
    step = max(align, octave // steps_per_octave)
    return -(-rows // step) * step


@dataclass(frozen=True, slots=True)
class SizePlan:
    """A fast kernel chosen per forward size (GPU kernels, R-DT-3): a forward of T tokens takes it
    when it was measurably faster at the smallest measured size >= T; past the largest size
    measured, and wherever it did not win, the reference kernel serves. Never slower, by
    construction, at any size that was measured."""

    verdicts: tuple[tuple[int, bool], ...] = ()  # (measured tokens, fast won), by tokens

    def use_fast(self, tokens: int) -> bool:
        for size, fast in self.verdicts:
            if tokens <= size:
                return fast
        return False

    @property
    def enabled(self) -> bool:
        return any(fast for _, fast in self.verdicts)

    @property
    def switch_tokens(self) -> int | None:
        """The smallest size past which the kernel differs from a 1-token forward's; None: one
        kernel at every size."""
        if not self.enabled:
            return None
        first = self.use_fast(1)
        for size, fast in self.verdicts:
            if fast != first:
                return max(size_before for size_before, _ in self.verdicts if size_before < size)
        return self.verdicts[-1][0] if first else None

    def fast_ranges(self) -> list[tuple[int, int]]:
        """The (from, to) token ranges served by the fast kernel, for the card."""
        ranges: list[tuple[int, int]] = []
        low = 1
        for size, fast in self.verdicts:
            if fast:
                if ranges and ranges[-1][1] == low - 1:
                    ranges[-1] = (ranges[-1][0], size)
                else:
                    ranges.append((low, size))
            low = size + 1
        return ranges


def plan_by_size(timings: Iterable[KernelTiming], min_speedup: float = DEFAULT_MIN_SPEEDUP) -> SizePlan:
    """The per-size plan of TIMINGS: fast wherever it won by at least MIN_SPEEDUP."""
    if min_speedup <= 0:
        raise ValueError(f"min_speedup must be > 0, got {min_speedup}")
    ordered = sorted(timings, key=lambda t: t.tokens)
    if any(t.tokens < 1 for t in ordered):
        raise ValueError("a timing below 1 token")
    if len({t.tokens for t in ordered}) != len(ordered):
        raise ValueError("two timings of the same size")
    return SizePlan(tuple((t.tokens, t.speedup >= min_speedup) for t in ordered))
