"""`vllm-srun fixture OUT --family F [--variant V] --seed N` (R-PKG-3): a tiny random-weight
package of a family, with its golden file recorded by running our own serving path on it.

Each family registers a writer: `writer(out, variant, seed)` writes the package files into OUT
and returns the requests (`{surface, body}`) its golden file records. The decision and
multimodal families add theirs with `register_fixture_writer`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from vllm_srun.adapters.families.decision_fixture import VARIANTS as DECISION_VARIANTS
from vllm_srun.adapters.families.decision_fixture import write_decision_fixture
from vllm_srun.adapters.families.encoder_fixture import VARIANTS as ENCODER_VARIANTS
from vllm_srun.adapters.families.encoder_fixture import write_encoder_fixture

Writer = Callable[[Path, "str | None", int], "list[dict[str, Any]]"]


@dataclass(frozen=True)
class FixtureWriter:
    write: Writer
    variants: tuple[str, ...]


FIXTURE_WRITERS: dict[str, FixtureWriter] = {
    "encoder": FixtureWriter(write_encoder_fixture, ENCODER_VARIANTS),
    "decision": FixtureWriter(write_decision_fixture, DECISION_VARIANTS),  # tiny Llama/Qwen3 decoder
}


def register_fixture_writer(family: str, write: Writer, variants: tuple[str, ...]) -> None:
    FIXTURE_WRITERS[family] = FixtureWriter(write, variants)


def write_fixture(out: Path, family: str, variant: str | None = None, seed: int = 0, *, golden: bool = True,
                  progress: Callable[[str], None] | None = None) -> Path:
    """Write the package into OUT (new or empty) and record its golden file; returns OUT."""
    writer = FIXTURE_WRITERS.get(family)
    if writer is None:
        raise ValueError(f"no fixture writer for family {family!r} (known: {', '.join(sorted(FIXTURE_WRITERS))})")
    if variant is not None and variant not in writer.variants:
        raise ValueError(f"{family} fixtures come in variants {', '.join(writer.variants)} (got {variant!r})")
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out} exists and is not an empty folder")
    out.mkdir(parents=True, exist_ok=True)
    requests = writer.write(out, variant, seed)
    if golden:
        from vllm_srun.adapters.readiness.golden_record import record_golden

        record_golden(out, requests, progress=progress)
    return out
