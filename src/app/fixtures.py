"""`vllm-srun fixture OUT --family F [--variant V] --seed N` (R-PKG-3): a tiny random-weight
package of a family, with its golden file recorded by running our own serving path on it.

The family plugin writes the package (`Family.write_fixture`, returning the requests its golden
file records); this module records the golden file through a worker container.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from vllm_srun.adapters.contracts import ModelStore
from vllm_srun.adapters.engines.registry import EngineRegistry
from vllm_srun.adapters.families.registry import FamilyRegistry


def write_fixture(
    out: Path,
    family: str,
    variant: str | None = None,
    seed: int = 0,
    *,
    golden: bool = True,
    progress: Callable[[str], None] | None = None,
    families: FamilyRegistry | None = None,
    engines: EngineRegistry | None = None,
    store: ModelStore | None = None,
) -> Path:
    """Write the package into OUT (new or empty) and record its golden file; returns OUT.

    FAMILIES, ENGINES and STORE replace the installed plugins and the model store (tests, tools)."""
    families = families or FamilyRegistry()
    if family not in families.names():
        raise ValueError(f"no fixture writer for family {family!r} (known: {', '.join(fixture_families(families))})")
    plugin = families.get(family)
    if not plugin.fixture_variants:
        raise ValueError(f"the {family} family writes no fixtures (known: {', '.join(fixture_families(families))})")
    if variant is not None and variant not in plugin.fixture_variants:
        raise ValueError(f"{family} fixtures come in variants {', '.join(plugin.fixture_variants)} (got {variant!r})")
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out} exists and is not an empty folder")
    out.mkdir(parents=True, exist_ok=True)
    requests = plugin.write_fixture(out, variant, seed)
    if golden:
        from vllm_srun.app.golden_record import record_golden

        record_golden(out, requests, progress=progress, families=families, engines=engines, store=store)
    return out


def fixture_families(families: FamilyRegistry) -> list[str]:
    """The families that write fixtures."""
    return sorted(name for name in families.names() if families.get(name).fixture_variants)
