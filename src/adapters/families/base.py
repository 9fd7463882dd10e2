"""The family plugin contract (R-PKG-2): detect a package, load it, describe it, run rows.

A family parses packages and renders rows; it never imports an engine module. The runtime
calls `run(lane, payloads)` on the device thread, one forward at a time.

Engines reach a family through `LoadOptions.engines`, an `EngineFactory` the composition root
builds: the family loads its own model code, then asks the factory for the forward that serves
it (`EncoderForward`: the native torch engine, with or without the oneDNN fast path, or ONNX
Runtime). The Protocols below are the ports; engines satisfy them structurally.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

from vllm_srun.domain.engine_args import EngineArgs
from vllm_srun.domain.lanes import Lane

Progress = Callable[[str], None]


@dataclass(frozen=True)
class LoadOptions:
    device: str = "cpu"
    engine: str = "auto"
    args: EngineArgs = field(default_factory=EngineArgs)
    threads: int | None = None
    engines: EngineFactory | None = None  # None: the family's own reference forward (native, eager)
    package_sha256: str | None = None  # keys what an engine caches for this package (e.g. an exported graph)


class EncoderForward(Protocol):
    """An engine's forward for the encoder family: one batch of tokenized rows in, float32 arrays out."""

    engine: str  # the card's `engine`: native | onnxruntime
    # padded tokens past which this forward runs other kernels (None: the same kernels at every
    # size); a batch-invariance probe is only conclusive when that is at least R-BAT-5's 512
    kernel_switch_tokens: int | None

    def embed(self, batch: Sequence[Any]) -> Any: ...

    def classify_logits(self, batch: Sequence[Any]) -> Any: ...

    def describe(self) -> dict[str, Any]:
        """Card fields, e.g. `{"kernels": {"linear": "onednn_packed", "reason": ...}}`."""
        ...


class EngineFactory(Protocol):
    def encoder(self, runner: Any, options: LoadOptions, progress: Progress, *,
                onnx_file: Path | None = None, largest_forward_tokens: int = 4096) -> EncoderForward:
        """The forward serving RUNNER's model (our torch encoder + pooling/head) with the engine
        OPTIONS ask for; ONNX_FILE is the package's own graph when it ships one."""
        ...


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
