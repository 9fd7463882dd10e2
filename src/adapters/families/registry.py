"""Which family serves a package: the manifest (`srun.json`) names it, else each family detects."""

from __future__ import annotations

import json
from pathlib import Path

from vllm_srun.adapters.families.base import Family
from vllm_srun.adapters.families.decision import DecisionFamily
from vllm_srun.adapters.families.encoder import EncoderFamily
from vllm_srun.domain.errors import InvalidRequest

FAMILIES: dict[str, Family] = {f.name: f for f in (EncoderFamily(), DecisionFamily())}


def register(family: Family) -> None:
    FAMILIES[family.name] = family


def family_for(folder: Path) -> Family:
    manifest = folder / "srun.json"
    if manifest.exists():
        name = json.loads(manifest.read_text()).get("family")
        if name in FAMILIES:
            return FAMILIES[name]
        if name:
            raise InvalidRequest(f"{folder}: srun.json names unknown family {name!r}")
    for family in FAMILIES.values():
        if family.detect(folder):
            return family
    raise InvalidRequest(f"{folder}: no model family recognises this package (config.json model_type?)")
