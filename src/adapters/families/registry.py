"""Which family serves a package: the manifest (`srun.json`) names it, else each family detects
(a decoder package by what it is: `decoder_packages.py`); a package none detects is refused in one
line naming its model_type and architectures.

Families are plugins (group `vllm_srun.families`, `adapters/plugins.py`); the built-in encoder
and decision families register through this package's own entry points.
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib.metadata import EntryPoint
from pathlib import Path

from vllm_srun.adapters.contracts import Family
from vllm_srun.adapters.families.decoder_packages import describe_package
from vllm_srun.adapters.models.manifest import read_manifest
from vllm_srun.adapters.plugins import FAMILIES_GROUP, PluginInfo, PluginRegistry
from vllm_srun.domain.errors import InvalidRequest


class FamilyRegistry:
    def __init__(
        self, entries: Iterable[EntryPoint] | None = None, families: dict[str, tuple[PluginInfo, Family]] | None = None
    ) -> None:
        self.plugins: PluginRegistry[Family] = PluginRegistry(FAMILIES_GROUP, entries, families)

    def names(self) -> list[str]:
        return self.plugins.names()

    def get(self, name: str) -> Family:
        return self.plugins.get(name)

    def info(self, name: str) -> PluginInfo:
        return self.plugins.info(name)

    def family_for(self, folder: Path, forced: str | None = None) -> Family:
        """FORCED (a models file's `family`), which must be installed and read the package; else
        the family named by the package's manifest, else the first that detects it."""
        if forced is not None:
            if forced not in self.plugins:
                raise InvalidRequest(f"family {forced!r} is not installed (installed: {', '.join(self.names())})")
            family = self.plugins.get(forced)
            if not family.detect(folder):
                raise InvalidRequest(
                    f"{Path(folder).name}: the {forced} family cannot read this package ({describe_package(folder)})"
                )
            return family
        try:
            name = read_manifest(folder).get("family")
        except ValueError as exc:
            raise InvalidRequest(f"{Path(folder).name}: {exc}") from None
        if name:
            if name in self.plugins:
                return self.plugins.get(name)
            raise InvalidRequest(
                f"{Path(folder).name}: srun.json names unknown family {name!r} (installed: {', '.join(self.names())})"
            )
        for _, family in self.plugins:
            if family.detect(folder):
                return family
        raise InvalidRequest(
            f"{Path(folder).name}: no model family serves this package ({describe_package(folder)}; "
            f"installed: {', '.join(self.names())})"
        )
