"""docs/metrics.md and the code declare the same metrics, so neither can drift from the other."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_srun.adapters.front.metrics import FrontMetrics
from vllm_srun.adapters.serving.metrics import (
    RATIO_BUCKETS,
    ROWS_BUCKETS,
    SECONDS_BUCKETS,
    TOKENS_BUCKETS,
    RuntimeMetrics,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"

Row = tuple[str, str, tuple[str, ...], str]  # name, type, labels (sorted), meaning


def sections(text: str) -> dict[str, list[str]]:
    """The lines under each `## ` heading, by the heading's first word."""
    out: dict[str, list[str]] = {}
    current: list[str] = []
    for line in text.splitlines():
        if line.startswith("## "):
            current = out.setdefault(line[3:].split()[0], [])
        else:
            current.append(line)
    return out


def table_rows(lines: list[str]) -> list[Row]:
    """The metric rows of a `| Name | Type | Labels | Meaning |` table (names in backticks)."""
    rows = []
    for line in lines:
        if not line.startswith("| `"):
            continue  # prose, the header row and the |---| row
        name, kind, labels, meaning = (cell.strip() for cell in line.strip().strip("|").split("|"))
        label_names = tuple(sorted(label.strip().strip("`") for label in labels.split(",") if label.strip()))
        rows.append((name.strip("`"), kind, label_names, meaning))
    return rows


DOCUMENTED = sections(DOC.read_text())


@pytest.mark.parametrize("heading, make", [("Worker", RuntimeMetrics), ("Front", FrontMetrics)])
def test_the_table_lists_exactly_the_declared_metrics(heading: str, make: type[RuntimeMetrics | FrontMetrics]) -> None:
    rows = table_rows(DOCUMENTED[heading])
    documented = {name: (kind, labels) for name, kind, labels, _ in rows}
    declared = {s.name: (s.kind, tuple(sorted(s.labels))) for s in make().registry.specs}
    assert documented == declared
    assert len(rows) == len(documented)  # no metric documented twice
    assert all(meaning for *_, meaning in rows)


def test_the_bucket_sets_are_the_code_s() -> None:
    documented = {}
    for line in DOCUMENTED["Histogram"]:
        if line.startswith("- ") and ":" in line:
            name, bounds = line[2:].split(":", 1)
            documented[name] = tuple(float(b) for b in bounds.split(","))
    expected = {"seconds": SECONDS_BUCKETS, "rows": ROWS_BUCKETS, "tokens": TOKENS_BUCKETS, "ratio": RATIO_BUCKETS}
    assert documented == {name: tuple(map(float, bounds)) for name, bounds in expected.items()}
