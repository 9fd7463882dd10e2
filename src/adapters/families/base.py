"""The family plugin contract (R-PKG-2): detect a package, load it, describe it, run rows.

A family parses packages and renders rows; it never imports an engine module. The runtime
calls `run(lane, payloads)` on the device thread, one forward at a time.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from vllm_srun.domain.engine_args import EngineArgs
from vllm_srun.domain.lanes import Lane

Progress = Callable[[str], None]


@dataclass(frozen=True)
class LoadOptions:
    device: str = "cpu"
    engine: str = "auto"
    args: EngineArgs = field(default_factory=EngineArgs)
    threads: int | None = None


class LoadedModel(abc.ABC):
    family: str
    surfaces: frozenset[str]
    lanes: tuple[Lane, ...]
    dtype: str
    device: str
    engine: str
    batch_invariant: bool = False
    max_input_tokens: int

    @abc.abstractmethod
    def run(self, lane: str, payloads: Sequence[Any]) -> Sequence[Any]:
        """One forward (device thread): one output per payload, in order."""

    def describe(self) -> dict[str, Any]:
        """Family-specific card fields."""
        return {}

    @property
    def numerics(self) -> str:
        return "exact" if self.batch_invariant else "approximate"


class Family(abc.ABC):
    name: str

    @abc.abstractmethod
    def detect(self, folder: Path) -> bool: ...

    @abc.abstractmethod
    def load(self, folder: Path, options: LoadOptions, progress: Progress) -> LoadedModel: ...
