"""Engine selection: `--engine NAME` → the engine plugin of that name (group `vllm_srun.engines`);
`auto` → the first plugin that serves the model's kind, `native` (our torch code) first.
Implements the `EngineSelector` contract families load with.
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib.metadata import EntryPoint

from vllm_srun.adapters.contracts import (
    Device,
    DevicePreflight,
    Engine,
    EnginePlugin,
    EngineRefused,
    EngineRequest,
    Progress,
)
from vllm_srun.adapters.plugins import ENGINES_GROUP, PluginInfo, PluginRegistry

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

    def info(self, name: str) -> PluginInfo:
        return self.plugins.info(name)

    def resolve_name(self, requested: str) -> str:
        """REQUESTED when it is installed (or `auto`); EngineRefused with one line otherwise."""
        if requested != AUTO and requested not in self.plugins:
            raise EngineRefused(f"unknown engine {requested!r} (installed: {', '.join(self.choices())})")
        return requested

    def device_refusal(self, requested: str, device: Device) -> str | None:
        """Why engine REQUESTED cannot run on DEVICE (one line, before any weights load), or None.
        `auto` is never refused here: another engine may serve."""
        if requested == AUTO:
            return None
        plugin = self.plugins.get(requested)
        return plugin.device_refusal(device) if isinstance(plugin, DevicePreflight) else None

    def build(self, requested: str, request: EngineRequest, progress: Progress) -> Engine:
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
