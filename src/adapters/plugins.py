"""Plugins found through package entry points: families (`vllm_srun.families`) and engines
(`vllm_srun.engines`). Ours register the same way a third-party package does (pyproject.toml
`[project.entry-points."vllm_srun.families"]`), so adding a family or an engine never means
editing this package.

A name claimed by two distributions is refused with one line naming both. A plugin is imported
only when it is first used (engines carry heavy imports such as onnxruntime). Each model's card
lists the plugins it uses (`plugins: [{group, name, distribution, version}]`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Generic, TypeVar

FAMILIES_GROUP = "vllm_srun.families"
ENGINES_GROUP = "vllm_srun.engines"

T = TypeVar("T")


class PluginConflict(ValueError):
    """A plugin name claimed twice, or a plugin that cannot be loaded (one line)."""


@dataclass(frozen=True)
class PluginInfo:
    group: str
    name: str
    distribution: str
    version: str

    def card(self) -> dict[str, str]:
        return {"group": self.group, "name": self.name, "distribution": self.distribution, "version": self.version}


def _origin(entry: EntryPoint) -> tuple[str, str]:
    dist = entry.dist
    if dist is None:  # an entry point made by hand (tests); not from an installed distribution
        return entry.value.split(":", 1)[0].split(".", 1)[0], "0"
    return dist.metadata["Name"] or dist.name, dist.version


class PluginRegistry(Generic[T]):
    """The plugins of one group: name → info, and the loaded object on first use."""

    def __init__(
        self,
        group: str,
        entries: Iterable[EntryPoint] | None = None,
        objects: dict[str, tuple[PluginInfo, T]] | None = None,
    ) -> None:
        self.group = group
        self._entries: dict[str, EntryPoint] = {}
        self._info: dict[str, PluginInfo] = {}
        self._loaded: dict[str, T] = {}
        found = entry_points(group=group) if entries is None else entries
        for entry in found:
            distribution, version = _origin(entry)
            info = PluginInfo(group, entry.name, distribution, version)
            known = self._info.get(entry.name)
            if known is not None and known.distribution != distribution:
                raise PluginConflict(
                    f"{group} plugin {entry.name!r} is claimed by both {known.distribution} {known.version} "
                    f"and {distribution} {version}; uninstall one of them"
                )
            self._entries[entry.name] = entry
            self._info[entry.name] = info
        for name, (info, obj) in (objects or {}).items():  # plugins given as objects (tests, tools)
            known = self._info.get(name)
            if known is not None and known.distribution != info.distribution:
                raise PluginConflict(
                    f"{group} plugin {name!r} is claimed by both {known.distribution} {known.version} "
                    f"and {info.distribution} {info.version}; uninstall one of them"
                )
            self._info[name] = info
            self._loaded[name] = obj

    def names(self) -> list[str]:
        return list(self._info)

    def __contains__(self, name: object) -> bool:
        return name in self._info

    def info(self, name: str) -> PluginInfo:
        return self._info[name]

    def get(self, name: str) -> T:
        if name not in self._info:
            raise KeyError(name)
        if name not in self._loaded:
            try:
                loaded: Any = self._entries[name].load()
            except Exception as exc:  # a broken plugin says which one, not a stack trace
                info = self._info[name]
                raise PluginConflict(
                    f"{self.group} plugin {name!r} from {info.distribution} cannot be loaded: {type(exc).__name__}: {exc}"
                ) from exc
            self._loaded[name] = loaded() if isinstance(loaded, type) else loaded
        return self._loaded[name]

    def __iter__(self) -> Iterator[tuple[str, T]]:
        for name in self._info:
            yield name, self.get(name)
