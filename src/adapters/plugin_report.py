"""`vllm-srun plugins`: the installed families and engines (entry points, `plugins.py`), each as
its card says it (`group`, `name`, `distribution`, `version`, the card a served model lists) with
what it offers (`capabilities`), and the profiles every model may serve (R-PROF; R-PKG-6).

- a family: the options a models file entry may give it (`Family.options`) and the fixture
  variants `vllm-srun fixture` writes;
- an engine: the dtypes and `--deterministic` it takes whatever the model (its own
  `settings_refusal`, as `serve` asks it), and, for each device of this machine, whether it runs
  there (its own `device_refusal`: null when it does, else why not).

A plugin that cannot be loaded is listed with `error` instead of its capabilities; a listing
never fails for one broken plugin.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vllm_srun.adapters.contracts import Device, EngineSettings
from vllm_srun.adapters.engines.registry import EngineRegistry
from vllm_srun.adapters.families.registry import FamilyRegistry
from vllm_srun.adapters.plugins import PluginConflict
from vllm_srun.domain.settings import bounds
from vllm_srun.domain.settings.profiles import PROFILES


def family_entry(families: FamilyRegistry, name: str) -> dict[str, Any]:
    entry: dict[str, Any] = dict(families.info(name).card())
    try:
        family = families.get(name)
    except PluginConflict as exc:
        return {**entry, "error": str(exc)}
    entry["capabilities"] = {
        "options": sorted(family.options),
        "fixture_variants": list(family.fixture_variants),
    }
    return entry


def engine_entry(engines: EngineRegistry, name: str, devices: Sequence[Device]) -> dict[str, Any]:
    entry: dict[str, Any] = dict(engines.info(name).card())
    try:
        dtypes = [d for d in bounds.DTYPE.choices if engines.settings_refusal(name, EngineSettings(dtype=d)) is None]
        refused = engines.settings_refusal(name, EngineSettings(deterministic=True))
        on_devices = {device.name: engines.device_refusal(name, device) for device in devices}
    except PluginConflict as exc:
        return {**entry, "error": str(exc)}
    entry["capabilities"] = {
        "dtypes": dtypes,
        "deterministic": refused is None,
        "devices": on_devices,
    }
    return entry


def plugin_report(families: FamilyRegistry, engines: EngineRegistry, devices: Sequence[Device]) -> dict[str, Any]:
    """`vllm-srun plugins`' answer: families, engines (their capabilities on DEVICES) and profiles."""
    return {
        "families": [family_entry(families, name) for name in families.names()],
        "engines": [engine_entry(engines, name, devices) for name in engines.names()],
        "profiles": [profile.card() for profile in PROFILES.values()],
    }
