"""Read a Prometheus text exposition in tests, with prometheus_client's own parser."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample


def samples(text: str) -> list[Sample]:
    """Every sample of the exposition, in order."""
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples named NAME whose labels include LABELS (0.0 when there are none)."""
    return sum(s.value for s in samples(text) if s.name == name and labels.items() <= s.labels.items())
