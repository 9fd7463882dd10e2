"""Engines: what runs a loaded model's forwards, the plugins that build them, and how an engine
honours `--deterministic` (`Determinism`).

A family asks for its forward through `LoadContext.build_engine` (`contracts/family.py`) and
narrows it with `as_encoder_engine` / `as_decoder_engine` / `as_dual_encoder_engine` /
`as_audio_encoder_engine`; it never
imports an engine module.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, Protocol, runtime_checkable

from vllm_srun.adapters.contracts.batch import Batch, BatchOutputs
from vllm_srun.adapters.contracts.common import CardFields, PluginCard, Progress
from vllm_srun.adapters.contracts.device import Device
from vllm_srun.domain.worker.lifecycle import Determinism  # the domain decides it (issue 22 item 3)

if TYPE_CHECKING:  # types only: no array or tensor library is imported with the contracts
    import numpy as np
    import torch
    from numpy.typing import NDArray

    from vllm_srun.domain.scheduling.lanes import Accounting

__all__ = [
    "AudioEncoderEngine",
    "DecoderEngine",
    "Determinism",
    "DevicePreflight",
    "DualEncoderEngine",
    "EncoderEngine",
    "Engine",
    "EngineCatalog",
    "EnginePlugin",
    "EngineRefused",
    "EngineRequest",
    "EngineSelector",
    "EngineSettings",
    "PrefixState",
    "SettingRefusal",
    "SettingsPreflight",
    "as_audio_encoder_engine",
    "as_decoder_engine",
    "as_dual_encoder_engine",
    "as_encoder_engine",
]


class Engine(Protocol):
    """What runs a loaded model's forwards: our torch code (`native`), ONNX Runtime, a plugin's.

    Family-specific forwards extend it (the encoder family's `forward(batch)`, the
    decision family's decoder calls); the serving core reads only what is declared here.
    """

    @property
    def name(self) -> str:
        """The card's `engine` (equal to the name of the plugin that built it)."""
        ...

    @property
    def accounting(self) -> Accounting:
        """How the planner counts this engine's forwards (R-BAT-2): padded or packed."""
        ...

    @property
    def kernel_switch_tokens(self) -> int | None:
        """Counted tokens past which forwards run other kernels; None: the same kernels at every
        size. A batch-invariant model's merged forwards stay within it (R-BAT-5,
        `domain.scheduling.planning.invariant_forward_tokens`), so the probe checks the kernels they run on."""
        ...

    def describe(self) -> CardFields:
        """Card fields, e.g. `{"kernels": {"linear": "onednn_packed", "reason": ...}}`."""
        ...

    @property
    def forward_threads(self) -> bool:
        """Whether each forward runs on the intra-op thread count declared in the process's
        `ThreadContext` (torch engines), so adaptive threads can vary it (R-CPU-2); False for an
        engine whose count is fixed when it is built (an ONNX Runtime session)."""
        ...

    @property
    def determinism(self) -> Determinism | None:
        """How this engine honours `--deterministic`: a `Determinism` value (`batch_invariant`: a
        row gets the same bits in any forward it shares, at any size; `rows_alone`: only a row run
        alone is reproducible, so the scheduler runs one row per forward), or None: it cannot (the
        worker refuses). A plain string is accepted (a `StrEnum` compares equal to its value); the
        runtime reads it with `Determinism(value)` and refuses any other value at load."""
        ...


@runtime_checkable
class EncoderEngine(Engine, Protocol):
    """The encoder family's forward: one planned forward's `Batch` (`batch.py`: the rows and what
    each asks — pooled embedding, head logits, token states) in, one output per row out, in one
    call whatever the rows mix."""

    def forward(self, batch: Batch) -> BatchOutputs:
        """BATCH's outputs in row order: float32 [dimensions] for `Ask.EMBEDDING`, float32 [labels]
        for `Ask.LOGITS`, the row's last hidden states [tokens, hidden] for `Ask.TOKENS`."""
        ...


class PrefixState(Protocol):
    """A shared state's keys and values after `DecoderEngine.prefix_kv` (the engine's own type;
    the family hands it back to `branch_logits` unread)."""

    @property
    def length(self) -> int:
        """The state's tokens."""
        ...


@runtime_checkable
class DecoderEngine(Engine, Protocol):
    """The decision family's forward over a decoder LM (R-SC branch layout included)."""

    @property
    def vocab_size(self) -> int: ...

    def logits_at(self, rows: Sequence[Sequence[int]]) -> torch.Tensor:
        """Next-token logits after each row's last token, [rows, vocab]. The engine lays the rows
        out as its `accounting` says (right-padded, or back to back)."""
        ...

    def answer_logits(self, rows: Sequence[Sequence[int]], tokens: Sequence[Sequence[int]]) -> torch.Tensor:
        """The next-token logits after each row's last token at that row's TOKENS only, flat
        [sum of len(tokens)], row by row in the order given (`models/answer_logits.py`): what a
        decision reads. An engine may compute only these rows of its output layer."""
        ...

    def prefix_kv(self, state_ids: Sequence[int]) -> PrefixState:
        """The state's keys and values, computed once for its branches."""
        ...

    def branch_logits(self, state: PrefixState, branches: Sequence[Sequence[int]], *, chunk: int) -> torch.Tensor:
        """Each branch's next-token logits after the shared state, [branches, vocab]."""
        ...


@runtime_checkable
class DualEncoderEngine(Engine, Protocol):
    """The multimodal family's forward over a CLIP-style dual encoder: token id rows or
    preprocessed pixels in, L2-normalized float32 embeddings of one shared space out."""

    def embed_text(self, batch: Sequence[Sequence[int]]) -> NDArray[np.float32]:
        """[rows, dimensions] for token id rows."""
        ...

    def embed_images(self, pixels: Sequence[NDArray[np.float32]]) -> NDArray[np.float32]:
        """[rows, dimensions] for float32 [3, H, W] pixel arrays."""
        ...


@runtime_checkable
class AudioEncoderEngine(Engine, Protocol):
    """The audio family's forward: feature arrays made by its decoder (log-mel spectrograms) in,
    one float32 embedding each out; token id rows in for a model with a text tower (CLAP)."""

    def embed_audio(self, features: Sequence[NDArray[np.float32]]) -> NDArray[np.float32]:
        """[rows, dimensions] for the feature arrays (all of one shape)."""
        ...

    def embed_text(self, batch: Sequence[Sequence[int]]) -> NDArray[np.float32]:
        """[rows, dimensions] for token id rows (a model without a text tower never gets any)."""
        ...


class EngineRefused(ValueError):
    """An engine plugin cannot serve this model here (one line saying why)."""


def as_encoder_engine(engine: Engine) -> EncoderEngine:
    """ENGINE as an encoder forward, or EngineRefused when it has none."""
    if not isinstance(engine, EncoderEngine):
        raise EngineRefused(f"the {engine.name} engine has no encoder forward")
    return engine


def as_decoder_engine(engine: Engine) -> DecoderEngine:
    """ENGINE as a decoder forward, or EngineRefused when it has none."""
    if not isinstance(engine, DecoderEngine):
        raise EngineRefused(f"the {engine.name} engine has no decoder forward")
    return engine


def as_dual_encoder_engine(engine: Engine) -> DualEncoderEngine:
    """ENGINE as a dual-encoder forward, or EngineRefused when it has none."""
    if not isinstance(engine, DualEncoderEngine):
        raise EngineRefused(f"the {engine.name} engine has no dual-encoder forward")
    return engine


def as_audio_encoder_engine(engine: Engine) -> AudioEncoderEngine:
    """ENGINE as an audio-encoder forward, or EngineRefused when it has none."""
    if not isinstance(engine, AudioEncoderEngine):
        raise EngineRefused(f"the {engine.name} engine has no audio-encoder forward")
    return engine


@dataclass(frozen=True)
class EngineRequest:
    """What a family asks an engine plugin to serve.

    `model` is the family's loaded model code, of the type its `kind` names; the engine plugin
    that serves the kind narrows it with one isinstance check and refuses (`EngineRefused`, one
    line) anything else, so a request never carries an unread guess. Our kinds (the native
    plugin's helpers in `engines/plugins.py`):

    - `encoder`: `models/reference_encoder.ReferenceEncoder` (`encoder_model`);
    - `decoder`: `models/decoder.DecoderLM` or `models/qwen3_5.Qwen35LM` (`decoder_model`);
    - `dual_encoder`: `models/dual_encoder.DualEncoder` (`dual_encoder_model`);
    - `audio_encoder`: a `models/audio_arch.AudioNetwork` (`audio_model`).

    A plugin family's own kind carries its own type, which its engine plugin narrows the same way.
    """

    kind: str  # the forward's kind: "encoder", "decoder", "dual_encoder", "audio_encoder", or a plugin family's own
    model: object  # the family's loaded model code, of the type KIND names (class doc)
    device: Device
    threads: int | None = None
    package_sha256: str | None = None  # keys what the engine caches for this package
    package_graph: Path | None = None  # a graph the package ships (e.g. model.onnx)
    largest_forward_tokens: int = 4096  # the family's cap on one forward (kernel plans measure up to it)
    cache_dir: Path | None = None  # where engines keep exported graphs and kernel timings
    deterministic: bool = False  # `--deterministic`: prefer kernels that give a row the same bits in any batch
    # the exact profile (R-PROF-1): where the engine has kernels that give a row the same bits in any
    # batch, serve every forward with them, so that rows still merge; an engine without them is not refused
    prefer_invariant: bool = False


class EnginePlugin(Protocol):
    """An entry point of group `vllm_srun.engines`: builds engines of one name."""

    name: str

    def build(self, request: EngineRequest, progress: Progress) -> Engine:
        """The engine serving REQUEST; raises EngineRefused when it cannot (kind or device)."""
        ...


@runtime_checkable
class DevicePreflight(Protocol):
    """An engine plugin that can tell, before any weights load, that it cannot run on a device
    (e.g. ONNX Runtime without the GPU's execution provider); `--engine NAME` asks it at startup."""

    def device_refusal(self, device: Device) -> str | None:
        """One line saying what is missing to run on DEVICE, or None."""
        ...


# ---- issue 22 item 4: the settings an engine plugin refuses, whatever the model ----------------
@dataclass(frozen=True)
class EngineSettings:
    """The serving settings an engine plugin may refuse before anything loads."""

    dtype: str = "auto"  # `--dtype` / a deployment's `dtype` as asked (before `auto` is resolved)
    deterministic: bool = False  # `--deterministic`


class SettingRefusal(NamedTuple):
    setting: str  # the refused field of `EngineSettings` (`dtype`, `deterministic`)
    reason: str  # one line, e.g. "the onnxruntime engine runs only dtype auto"


@runtime_checkable
class SettingsPreflight(Protocol):
    """An engine plugin that refuses some settings whatever the model (ONNX Runtime: dtype auto
    only, no `--deterministic`). Both CLIs, the models file and the front's config ask it through
    the engine registry before anything loads; a plugin without it refuses nothing here."""

    def settings_refusal(self, settings: EngineSettings) -> SettingRefusal | None: ...


# ---- end of issue 22 item 4 ---------------------------------------------------------------------


class EngineSelector(Protocol):
    """Picks the engine plugin `--engine` names (`auto`: the first that accepts) and builds."""

    def build(self, requested: str, request: EngineRequest, progress: Progress) -> Engine: ...


class EngineCatalog(EngineSelector, Protocol):
    """The installed engine plugins as the runtime sees them (`engines/registry.EngineRegistry`):
    it builds through them and shows the one a model uses on its card."""

    def names(self) -> list[str]: ...

    def info(self, name: str) -> PluginCard: ...
