"""Engine selection: `--engine NAME` → the engine plugin of that name (group `vllm_srun.engines`);
`auto` → the first plugin that serves the model's kind, `native` (our torch code) first.
Implements the `EngineSelector` contract families load with.

The names `--engine` (both CLIs) and a deployment's `engine` take are `auto` and every installed
engine plugin's: the domain knows only how a name is spelled (`bounds.ENGINE`), and this registry
is the one place that refuses a name nothing installs (`unknown`, one line naming the installed
ones) and asks a plugin which settings it refuses whatever the model (`settings_refusal`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from importlib.metadata import EntryPoint
from typing import TYPE_CHECKING

from vllm_srun.adapters.plugins import ENGINES_GROUP, PluginInfo, PluginRegistry

if TYPE_CHECKING:  # imported where used: both CLIs build their parsers from the names alone, and
    # the contracts package would add about 100 ms to every `vllm-srun`/`vllm-sr` start
    from vllm_srun.adapters.contracts import (
        Device,
        Engine,
        EnginePlugin,
        EngineRequest,
        EngineSettings,
        Progress,
        SettingRefusal,
    )

AUTO = "auto"
DEFAULT_ENGINE = "native"


class EngineRegistry:
    def __init__(
        self,
        entries: Iterable[EntryPoint] | None = None,
        engines: dict[str, tuple[PluginInfo, EnginePlugin]] | None = None,
    ) -> None:
        self.plugins: PluginRegistry[EnginePlugin] = PluginRegistry(ENGINES_GROUP, entries, engines)

    def names(self) -> list[str]:
        return self.plugins.names()

    def choices(self) -> list[str]:
        """What `--engine` accepts: auto and every installed engine."""
        return [AUTO, *self.names()]

    def choices_text(self) -> str:
        """The names `--engine` and a deployment's `engine` take, in words (for help texts)."""
        return (
            f"{AUTO} (the first installed engine that serves the model, {DEFAULT_ENGINE} first) "
            f"or an installed engine: {', '.join(self.names())}"
        )

    def info(self, name: str) -> PluginInfo:
        return self.plugins.info(name)

    def unknown(self, requested: str) -> str | None:
        """The one line refusing REQUESTED when it is neither auto nor an installed engine; None
        when it is one of them."""
        if requested == AUTO or requested in self.plugins:
            return None
        return f"unknown engine {requested!r}: installed are {', '.join(self.names())} (or {AUTO})"

    def resolve_name(self, requested: str) -> str:
        """REQUESTED when it is installed (or `auto`); EngineRefused with one line otherwise."""
        refusal = self.unknown(requested)
        if refusal is not None:
            from vllm_srun.adapters.contracts import EngineRefused

            raise EngineRefused(refusal)
        return requested

    def device_refusal(self, requested: str, device: Device) -> str | None:
        """Why engine REQUESTED cannot run on DEVICE (one line, before any weights load), or None.
        `auto` is never refused here: another engine may serve."""
        if requested == AUTO:
            return None
        from vllm_srun.adapters.contracts import DevicePreflight

        plugin = self.plugins.get(requested)
        return plugin.device_refusal(device) if isinstance(plugin, DevicePreflight) else None

    def settings_refusal(self, requested: str, settings: EngineSettings) -> SettingRefusal | None:
        """Which of SETTINGS engine REQUESTED refuses whatever the model, and why; None when it
        takes them (a plugin without `SettingsPreflight` takes any). `auto` is never refused
        here: another engine may serve."""
        if requested == AUTO:
            return None
        from vllm_srun.adapters.contracts import SettingsPreflight

        plugin = self.plugins.get(requested)
        return plugin.settings_refusal(settings) if isinstance(plugin, SettingsPreflight) else None

    def flag_refusal(self, requested: str, settings: EngineSettings) -> str | None:
        """`settings_refusal` as a command line's one line: `--dtype bfloat16: why`,
        `--deterministic: why`."""
        refusal = self.settings_refusal(requested, settings)
        if refusal is None:
            return None
        flag = "--" + refusal.setting.replace("_", "-")
        value = getattr(settings, refusal.setting, None)
        shown = "" if isinstance(value, bool) or value is None else f" {value}"
        return f"{flag}{shown}: {refusal.reason}"

    def build(self, requested: str, request: EngineRequest, progress: Progress) -> Engine:
        from vllm_srun.adapters.contracts import EngineRefused

        if self.resolve_name(requested) != AUTO:
            return self.plugins.get(requested).build(request, progress)
        order = sorted(self.names(), key=lambda name: name != DEFAULT_ENGINE)
        refusals = []
        for name in order:
            try:
                return self.plugins.get(name).build(request, progress)
            except EngineRefused as exc:
                refusals.append(str(exc))
        raise EngineRefused(f"no installed engine serves {request.kind} models: " + "; ".join(refusals))


@functools.cache
def installed_engines() -> EngineRegistry:
    """The engines this process's installed distributions register, read once per process (the
    CLIs' help texts and name checks, the config loader). Raises PluginConflict (one line) when
    two distributions claim one name."""
    return EngineRegistry()
