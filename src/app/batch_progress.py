"""`vllm-srun batch`'s progress on stderr: on a terminal, one line redrawn at most every
REDRAW_S (done/total, a bar, rows/s of this run, ETA, error lines); elsewhere (a log, a pipe)
nothing until the one summary line at the end."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

REDRAW_S = 0.2
BAR_CELLS = 24


@dataclass
class Summary:
    """What a run did: lines answered 2xx, error lines (non-2xx answers and bad lines), lines an
    earlier run had answered, seconds, and why it stopped early (None: it did not)."""

    total: int = 0
    ok: int = 0
    errors: int = 0
    skipped: int = 0
    retries: int = 0
    seconds: float = 0.0
    stopped: str | None = None

    @property
    def written(self) -> int:
        return self.ok + self.errors


def clock_text(seconds: float) -> str:
    """H:MM:SS, or M:SS under an hour."""
    whole = max(int(seconds + 0.5), 0)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def progress_text(done: int, total: int, rate: float, errors: int) -> str:
    """One progress line: DONE of TOTAL rows (earlier runs' included), RATE rows/s of this run."""
    share = done / total if total else 1.0
    filled = min(int(share * BAR_CELLS), BAR_CELLS)
    eta = clock_text((total - done) / rate) if rate > 0 and done < total else "--:--"
    bar = "#" * filled + "." * (BAR_CELLS - filled)
    text = f"batch [{bar}] {done:,}/{total:,} {share:4.0%} {rate:,.1f} rows/s ETA {eta}"
    return text + (f" ({errors:,} error lines)" if errors else "")


def summary_text(summary: Summary) -> str:
    """The last line: what this run wrote, what it skipped, how fast, and why it stopped early."""
    rate = summary.written / summary.seconds if summary.seconds > 0 else 0.0
    text = (
        f"batch: {summary.written:,} rows written ({summary.ok:,} ok, {summary.errors:,} error lines), "
        f"{summary.skipped:,} already in the output, in {summary.seconds:.1f} s ({rate:,.1f} rows/s)"
    )
    if summary.retries:
        text += f", {summary.retries:,} retries"
    if summary.stopped is not None:
        text += f"; stopped: {summary.stopped}; rerun to resume"
    return text


class ProgressBar:
    """Draws `progress_text` on STREAM when it is a terminal; always writes the summary line."""

    def __init__(self, stream: TextIO = sys.stderr, clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream
        self.clock = clock
        self.live = stream.isatty()
        self.total = 0
        self.before = 0  # rows an earlier run wrote
        self.started = 0.0
        self.drawn_at = -REDRAW_S

    def start(self, total: int, before: int) -> None:
        self.total, self.before, self.started = total, before, self.clock()
        self.update(0, 0)

    def update(self, written: int, errors: int) -> None:
        if not self.live:
            return
        now = self.clock()
        if now - self.drawn_at < REDRAW_S and self.before + written < self.total:
            return
        self.drawn_at = now
        elapsed = now - self.started
        rate = written / elapsed if elapsed > 0 else 0.0
        line = progress_text(min(self.before + written, self.total), self.total, rate, errors)
        self.stream.write("\r" + line + "\x1b[K")
        self.stream.flush()

    def say(self, line: str) -> None:
        """One line of its own (a wait, a resumption), on every stream, terminal or not."""
        self.stream.write(line + "\n")
        self.stream.flush()

    def finish(self, summary: Summary) -> None:
        if self.live:
            self.stream.write("\n")
        self.stream.write(summary_text(summary) + "\n")
        self.stream.flush()
