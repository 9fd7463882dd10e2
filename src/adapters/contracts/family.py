"""Families: a plugin that recognises a package, describes it without loading weights and loads
it into a `LoadedModel`; where packages come from (`ModelStore`); what a model's answers promise
(`Numerics`)."""

from __future__ import annotations

import abc
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from vllm_srun.adapters.contracts.common import CardFields, PluginCard, Progress, quiet
from vllm_srun.adapters.contracts.device import Device
from vllm_srun.adapters.contracts.engine import Determinism, Engine, EngineRequest, EngineSelector
from vllm_srun.domain.scheduling.planning import invariant_forward_tokens

if TYPE_CHECKING:  # types only (media worker processes import the contracts: keep their start light)
    from vllm_srun.domain.scheduling.lanes import Lane
    from vllm_srun.domain.settings.engine_args import EngineArgs

__all__ = [
    "MANIFEST",
    "CalibrationForward",
    "Family",
    "FamilyFinder",
    "LoadContext",
    "LoadedModel",
    "ModelStore",
    "Numerics",
    "PackageInfo",
]


MANIFEST = "srun.json"  # the runtime manifest a package may carry beside its own files (R-PKG-1)


@dataclass(frozen=True)
class PackageInfo:
    """What a family tells about a package without loading its weights."""

    family: str
    surfaces: frozenset[str]
    max_input_tokens: int | None = None  # the package's own input limit; None: known after load
    # family-specific engine args this package takes beyond the batching ones (e.g. max_model_len)
    engine_args: frozenset[str] = frozenset()


@dataclass(frozen=True)
class LoadContext:
    """Everything a family's `load` gets from the runtime."""

    device: Device
    args: EngineArgs
    engines: EngineSelector
    engine_choice: str = "auto"  # `--engine`: a plugin name, or auto
    threads: int | None = None
    package_sha256: str | None = None
    cache_dir: Path | None = None
    progress: Progress = quiet
    deterministic: bool = False  # `--deterministic`: answers may not depend on batch, load or timings
    prefer_invariant: bool = False  # a profile that never coalesces (R-PROF-1): batch-invariant kernels where any
    options: Mapping[str, Any] = field(default_factory=dict)  # the family's options (`Family.options`)

    def model_dtype(self, family: str) -> str:
        """The dtype FAMILY's model computes in here (`--dtype`, `auto` by the family's table);
        ValueError for float16 off a GPU."""
        from vllm_srun.domain.settings.dtypes import resolve_dtype

        dtype = resolve_dtype(self.args.dtype, family, self.device.name)
        if dtype == "float16" and self.device.kind not in ("cuda", "rocm"):
            raise ValueError(f"dtype float16 runs on GPUs only (device {self.device.name})")
        return dtype

    def engine_request(
        self, kind: str, model: object, *, package_graph: Path | None = None, largest_forward_tokens: int = 4096
    ) -> EngineRequest:
        """The request for KIND's forward over MODEL (the family's model code, `EngineRequest.model`)."""
        return EngineRequest(
            kind=kind,
            model=model,
            device=self.device,
            threads=self.threads,
            package_sha256=self.package_sha256,
            package_graph=package_graph,
            largest_forward_tokens=largest_forward_tokens,
            cache_dir=self.cache_dir,
            deterministic=self.deterministic,
            prefer_invariant=self.prefer_invariant,
        )

    def build_engine(
        self, kind: str, model: object, *, package_graph: Path | None = None, largest_forward_tokens: int = 4096
    ) -> Engine:
        """The engine `--engine` picks for KIND's forward over MODEL."""
        request = self.engine_request(
            kind, model, package_graph=package_graph, largest_forward_tokens=largest_forward_tokens
        )
        return self.engines.build(self.engine_choice, request, self.progress)


@dataclass(frozen=True)
class CalibrationForward:
    """Rows of one merged forward the calibration times (R-DEV-2)."""

    lane: str
    payloads: Sequence[object]  # the family's row payloads, handed back to its `run`
    tokens: int  # as the lane counts them (R-BAT-2)


class Numerics(enum.StrEnum):
    """What a model's answers promise (the card's `numerics`)."""

    DETERMINISTIC = "deterministic"  # `--deterministic` in force: bit-identical in any batch, load, cache state
    EXACT = "exact"  # batch-invariant (R-BAT-5): a row's answer does not depend on its company
    APPROXIMATE = "approximate"  # merged forwards may change a row's answer in its last bits

    @classmethod
    def promised(cls, batch_invariant: bool, determinism: Determinism | None) -> Numerics:
        """What a loaded model's answers promise: DETERMINISTIC where `--deterministic` is in force
        (DETERMINISM says how), else EXACT where the probe found it batch-invariant, else APPROXIMATE."""
        if determinism is not None:
            return cls.DETERMINISTIC
        return cls.EXACT if batch_invariant else cls.APPROXIMATE


class LoadedModel(abc.ABC):
    """A loaded package, ready to run forwards. Attributes are set by the family's `load` and
    not changed after it: what the runtime finds out later (the probe's verdict, how
    `--deterministic` is honoured, hence `numerics`) is kept in its serving record
    (`serving/model_setup.Serving`)."""

    family: str
    surfaces: frozenset[str]
    lanes: tuple[Lane, ...]  # rows of different lanes never share a forward (R-BAT-6)
    dtype: str
    device: Device
    engine: Engine
    max_input_tokens: int
    enable_shared_context: bool = False  # in force (R-SC); False for families without the path
    cache_tag: str = ""  # what besides the weights decides an answer (keys the result cache)
    golden_file: Path | None = None  # the package's recorded requests and answers (R-GOLD-1)
    # what its requests may carry, of "text", "image", "video", "audio" (`contracts/surfaces.py`:
    # a model naming a medium implements that medium's surface contract)
    modalities: frozenset[str] = frozenset({"text"})

    @abc.abstractmethod
    def run(self, lane: str, payloads: Sequence[Any]) -> Sequence[Any]:
        """One forward (on the device thread): one output per payload, in order. Payloads and
        outputs are the family's own types (what its surfaces' rows carry, what they read back);
        the core passes them through unread, so each family narrows them in its override."""

    def warm_up(self) -> None:  # noqa: B027 - optional hook, nothing to do by default
        """Run once at load, before the probe and the golden check (build kernels, caches)."""

    def probe_payloads(self) -> Sequence[object]:
        """Rows of the first lane, of mixed lengths, for the batch-invariance probe; () for none."""
        return ()

    def calibration_forward(self, tokens: int) -> CalibrationForward | None:
        """One merged forward of about TOKENS counted tokens of the first lane, for the GPU knee
        calibration (R-DEV-2); None when the family offers none (its class budget stays)."""
        return None

    def longest_row_tokens(self) -> int:
        """Counted tokens of the longest row one forward may hold (calibration sizes stop at
        max_num_seqs of them)."""
        return self.max_input_tokens

    def card_section(self) -> CardFields:
        """Family-specific card fields (R-API-6)."""
        return {}

    @property
    def invariant_tokens(self) -> int | None:
        """The most counted tokens of a merged forward if the model is batch-invariant (R-BAT-5):
        512, or less where its engine changes kernels below 512; None: it cannot be."""
        return invariant_forward_tokens(self.engine.kernel_switch_tokens)


class Family(abc.ABC):
    """An entry point of group `vllm_srun.families` (R-PKG-2)."""

    name: ClassVar[str]
    fixture_variants: ClassVar[tuple[str, ...]] = ()  # `vllm-srun fixture --variant` choices
    # the family's own options a models file entry may set (`options:`; its load reads them from
    # `LoadContext.options`); any other name is refused in one line before the load
    options: ClassVar[frozenset[str]] = frozenset()

    @abc.abstractmethod
    def detect(self, folder: Path) -> bool:
        """Whether this family reads the package in FOLDER (from its config, not its weights)."""

    @abc.abstractmethod
    def describe(self, folder: Path) -> PackageInfo:
        """The package's surfaces and limits, without loading weights (used before any load)."""

    @abc.abstractmethod
    def load(self, folder: Path, context: LoadContext) -> LoadedModel:
        """Load the package (on the device thread); raise ValueError with one line to refuse."""

    def write_fixture(self, out: Path, variant: str | None, seed: int) -> list[dict[str, object]]:
        """Write a tiny random-weight package into OUT (R-PKG-3); return the requests
        (`{surface, body}`, JSON as posted) its golden file records."""
        raise ValueError(f"the {self.name} family writes no fixtures")


class FamilyFinder(Protocol):
    """The installed family plugins as the runtime sees them (`families/registry.FamilyRegistry`)."""

    def family_for(self, folder: Path, forced: str | None = None) -> Family:
        """The family that reads the package in FOLDER (FORCED: that family, which must read it);
        raises InvalidRequest when none does."""
        ...

    def info(self, name: str) -> PluginCard: ...


class ModelStore(Protocol):
    """Resolves a model argument to a package folder (R-PKG-1, R-PKG-4)."""

    @property
    def root(self) -> Path: ...

    @property
    def engine_cache(self) -> Path:
        """Where engines keep what they derive from packages (exported graphs, kernel timings)."""
        ...

    def resolve(self, artifact: str, progress: Progress) -> Path:
        """A path, a stored name or a catalog name → a folder; raises ModelNotFound."""
        ...

    def pull(self, name: str, progress: Progress) -> Path:
        """Place a catalog model in the store; raises ModelNotFound."""
        ...
