"""The contracts between the serving core and everything that plugs into it.

The serving core (`adapters/serving`, `adapters/readiness`, `adapters/http`, `adapters/surfaces`)
relies on these declarations and on nothing else of a family or an engine:

- a **family** plugin (`Family`) recognises a package, describes it without loading weights,
  and loads it into a `LoadedModel`: the surfaces it serves, its lanes, its forward (`run`),
  warm-up, probe rows, golden file and card section;
- the loaded model runs its forwards on an **engine** (`Engine`), built by an engine plugin
  (`EnginePlugin`) that the family asks for through `LoadContext.engines`; a family never
  imports an engine module;
- on a **device** (`Device`): kind, index, memory, native dtypes, synchronize;
- packages come from a **model store** (`ModelStore`), time from the domain's `Clock`;
- media inputs (images, videos) are decoded and preprocessed by a `MediaDecoder` (in media
  worker processes or a thread), reached from the event loop through a `MediaLoader` that keeps
  the decode cache.

A surface (`/v1/embeddings`, `/v1/classify`, `/v1/rerank`, `/v1/decisions`) states what it
needs of a model as a Protocol of its own (`TextEmbedder`, `TextClassifier`, `PairScorer`,
`QuestionAnswerer`), plus the extensions a model may add (`MediaEmbedder`: image and video
items on `/v1/embeddings`); a model that lists the surface implements it, and the runtime checks
that at load (`surface_contract_problems`), so a family that forgets one fails to load with a
reason instead of failing requests.

Families and engines are found through package entry points (`adapters/plugins.py`); the
composition root (`app/container.py`) wires the rest. The domain keeps its own pure ports
(`domain/ports.py`). Fakes of every contract live in `tests/fakes.py` and `tests/fake_family.py`;
`docs/design.md` walks through adding a family or an engine.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from vllm_srun.adapters.media.ports import MediaDecoder, MediaError, MediaLimits, MediaLoader, MediaWorkerDied
from vllm_srun.domain.engine_args import EngineArgs
from vllm_srun.domain.lanes import Accounting, Lane
from vllm_srun.domain.planning import invariant_forward_tokens
from vllm_srun.domain.ports import Clock

if TYPE_CHECKING:  # types only: the contracts import no family code
    from vllm_srun.adapters.families.decision_rows import AskedQuestion, PreparedState
    from vllm_srun.adapters.models.tokenization import Encoded, TextTokenizer

__all__ = [
    "DETERMINISM_METHODS",
    "SURFACE_CONTRACTS",
    "CalibrationForward",
    "Clock",
    "DecoderEngine",
    "Device",
    "DevicePreflight",
    "DualEncoderEngine",
    "EncoderEngine",
    "Engine",
    "EnginePlugin",
    "EngineRefused",
    "EngineRequest",
    "EngineSelector",
    "Family",
    "LoadContext",
    "LoadedModel",
    "LogitsRow",
    "MediaDecoder",
    "MediaEmbedder",
    "MediaError",
    "MediaLimits",
    "MediaLoader",
    "MediaWorkerDied",
    "ModelStore",
    "PackageInfo",
    "PairScorer",
    "Progress",
    "QuestionAnswerer",
    "SurfaceContract",
    "TextClassifier",
    "TextEmbedder",
    "ThreadContext",
    "as_decoder_engine",
    "as_dual_encoder_engine",
    "as_encoder_engine",
    "quiet",
    "surface_contract_problems",
]

Progress = Callable[[str], None]


def quiet(_message: str) -> None:
    """A Progress that prints nothing."""


# ---- devices ----------------------------------------------------------------------------------
class Device(Protocol):
    """Where a model's weights live and its forwards run."""

    @property
    def kind(self) -> str:
        """`cpu`, `cuda`, `rocm`, `mps`, or a plugin's kind."""
        ...

    @property
    def index(self) -> int | None:
        """The device's index within its kind (`cuda:1` → 1); None for the CPU and MPS."""
        ...

    @property
    def name(self) -> str:
        """As asked for and shown in the card: `cpu`, `cuda:0`, `rocm:1`, `mps`."""
        ...

    @property
    def torch_device(self) -> str:
        """What torch calls it (`rocm:1` is `cuda:1` to torch's HIP build)."""
        ...

    @property
    def native_dtypes(self) -> frozenset[str]:
        """Dtypes it computes in natively (float32 always; bfloat16/float16 where it has kernels)."""
        ...

    def memory_total(self) -> int | None:
        """Bytes of device memory; None when the device reports none (CPU, MPS, plugin devices)."""
        ...

    def memory_free(self) -> int | None:
        """Bytes free now; None when the device reports none."""
        ...

    def synchronize(self) -> None:
        """Wait until queued work finished (timings on asynchronous devices)."""
        ...

    def reset_peak_memory(self) -> None:
        """Start measuring the peak of device memory allocated from now (calibration, R-DEV-2)."""
        ...

    def peak_memory(self) -> int | None:
        """Bytes allocated at the peak since `reset_peak_memory`, beyond what was allocated then;
        None when the device reports none."""
        ...


# ---- engines ----------------------------------------------------------------------------------
class Engine(Protocol):
    """What runs a loaded model's forwards: our torch code (`native`), ONNX Runtime, a plugin's.

    Family-specific forwards extend it (the encoder family's `embed`/`classify_logits`, the
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
        `domain.planning.invariant_forward_tokens`), so the probe checks the kernels they run on."""
        ...

    def describe(self) -> dict[str, Any]:
        """Card fields, e.g. `{"kernels": {"linear": "onednn_packed", "reason": ...}}`."""
        ...

    @property
    def forward_threads(self) -> bool:
        """Whether each forward runs on the intra-op thread count declared in the process's
        `ThreadContext` (torch engines), so adaptive threads can vary it (R-CPU-2); False for an
        engine whose count is fixed when it is built (an ONNX Runtime session)."""
        ...

    @property
    def determinism(self) -> str | None:
        """How this engine honours `--deterministic`: `batch_invariant` (a row gets the same bits
        in any forward it shares, at any size), `rows_alone` (only a row run alone is reproducible,
        so the scheduler runs one row per forward), or None: it cannot (the worker refuses)."""
        ...


DETERMINISM_METHODS = ("batch_invariant", "rows_alone")


class ThreadContext(Protocol):
    """The process's per-forward thread context (R-CPU-2): every forward declares the intra-op
    thread count it runs on, on the device thread, just before it runs; nothing else in the
    process sets a count, so models never inherit each other's."""

    @property
    def current(self) -> int | None:
        """The count the last forward declared (None before any)."""
        ...

    def declare(self, threads: int) -> None: ...


@runtime_checkable
class EncoderEngine(Engine, Protocol):
    """The encoder family's forward: tokenized rows (`Encoded`) in, float32 arrays out."""

    def embed(self, batch: Sequence[Encoded]) -> Any:
        """Pooled (and normalized when configured) embeddings, [rows, dimensions]."""
        ...

    def classify_logits(self, batch: Sequence[Encoded]) -> Any:
        """Sequence-classification logits, [rows, labels]."""
        ...


@runtime_checkable
class DecoderEngine(Engine, Protocol):
    """The decision family's forward over a decoder LM (R-SC branch layout included)."""

    @property
    def vocab_size(self) -> int: ...

    def logits_at(self, input_ids: Any, positions: Any) -> Any:
        """Next-token logits of each row at its position, [rows, vocab]."""
        ...

    def prefix_kv(self, state_ids: Sequence[int]) -> Any:
        """The state's keys and values, computed once for its branches."""
        ...

    def branch_logits(self, state: Any, branches: Sequence[Sequence[int]], *, chunk: int) -> Any:
        """Each branch's next-token logits after the shared state, [branches, vocab]."""
        ...


@runtime_checkable
class DualEncoderEngine(Engine, Protocol):
    """The multimodal family's forward over a CLIP-style dual encoder: token id rows or
    preprocessed pixels in, L2-normalized float32 embeddings of one shared space out."""

    def embed_text(self, batch: Sequence[Sequence[int]]) -> Any:
        """[rows, dimensions] for token id rows."""
        ...

    def embed_images(self, pixels: Sequence[Any]) -> Any:
        """[rows, dimensions] for float32 [3, H, W] pixel arrays."""
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


@dataclass(frozen=True)
class EngineRequest:
    """What a family asks an engine plugin to serve."""

    kind: str  # the forward's kind: "encoder", "decoder", or a plugin family's own
    model: Any  # the family's loaded model code (e.g. a ReferenceEncoder, a DecoderLM)
    device: Device
    threads: int | None = None
    package_sha256: str | None = None  # keys what the engine caches for this package
    package_graph: Path | None = None  # a graph the package ships (e.g. model.onnx)
    largest_forward_tokens: int = 4096  # the family's cap on one forward (kernel plans measure up to it)
    cache_dir: Path | None = None  # where engines keep exported graphs and kernel timings
    deterministic: bool = False  # `--deterministic`: prefer kernels that give a row the same bits in any batch


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


class EngineSelector(Protocol):
    """Picks the engine plugin `--engine` names (`auto`: the first that accepts) and builds."""

    def build(self, requested: str, request: EngineRequest, progress: Progress) -> Engine: ...


# ---- families ---------------------------------------------------------------------------------
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

    def engine_request(self, kind: str, model: Any, **extra: Any) -> EngineRequest:
        return EngineRequest(
            kind=kind,
            model=model,
            device=self.device,
            threads=self.threads,
            package_sha256=self.package_sha256,
            cache_dir=self.cache_dir,
            deterministic=self.deterministic,
            **extra,
        )

    def build_engine(self, kind: str, model: Any, **extra: Any) -> Engine:
        return self.engines.build(self.engine_choice, self.engine_request(kind, model, **extra), self.progress)


@dataclass(frozen=True)
class CalibrationForward:
    """Rows of one merged forward the calibration times (R-DEV-2)."""

    lane: str
    payloads: Sequence[Any]
    tokens: int  # as the lane counts them (R-BAT-2)


class LoadedModel(abc.ABC):
    """A loaded package, ready to run forwards. Attributes are set by the family's `load`."""

    family: str
    surfaces: frozenset[str]
    lanes: tuple[Lane, ...]  # rows of different lanes never share a forward (R-BAT-6)
    dtype: str
    device: Device
    engine: Engine
    max_input_tokens: int
    batch_invariant: bool = False  # set from the batch-invariance probe (R-BAT-5)
    deterministic: str | None = None  # `--deterministic` in force: how (a DETERMINISM_METHODS value)
    enable_shared_context: bool = False  # in force (R-SC); False for families without the path
    cache_tag: str = ""  # what besides the weights decides an answer (keys the result cache)
    golden_file: Path | None = None  # the package's recorded requests and answers (R-GOLD-1)

    @abc.abstractmethod
    def run(self, lane: str, payloads: Sequence[Any]) -> Sequence[Any]:
        """One forward (on the device thread): one output per payload, in order."""

    def warm_up(self) -> None:  # noqa: B027 - optional hook, nothing to do by default
        """Run once at load, before the probe and the golden check (build kernels, caches)."""

    def probe_payloads(self) -> Sequence[Any]:
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

    def card_section(self) -> dict[str, Any]:
        """Family-specific card fields (R-API-6)."""
        return {}

    @property
    def invariant_tokens(self) -> int | None:
        """The most counted tokens of a merged forward if the model is batch-invariant (R-BAT-5):
        512, or less where its engine changes kernels below 512; None: it cannot be."""
        return invariant_forward_tokens(self.engine.kernel_switch_tokens)

    @property
    def numerics(self) -> str:
        if self.deterministic is not None:
            return "deterministic"
        return "exact" if self.batch_invariant else "approximate"


class Family(abc.ABC):
    """An entry point of group `vllm_srun.families` (R-PKG-2)."""

    name: ClassVar[str]
    fixture_variants: ClassVar[tuple[str, ...]] = ()  # `vllm-srun fixture --variant` choices

    @abc.abstractmethod
    def detect(self, folder: Path) -> bool:
        """Whether this family reads the package in FOLDER (from its config, not its weights)."""

    @abc.abstractmethod
    def describe(self, folder: Path) -> PackageInfo:
        """The package's surfaces and limits, without loading weights (used before any load)."""

    @abc.abstractmethod
    def load(self, folder: Path, context: LoadContext) -> LoadedModel:
        """Load the package (on the device thread); raise ValueError with one line to refuse."""

    def write_fixture(self, out: Path, variant: str | None, seed: int) -> list[dict[str, Any]]:
        """Write a tiny random-weight package into OUT (R-PKG-3); return the requests
        (`{surface, body}`) its golden file records."""
        raise ValueError(f"the {self.name} family writes no fixtures")


# ---- what each surface needs of a model -------------------------------------------------------
@dataclass(frozen=True, slots=True)
class LogitsRow:
    """A classify or rerank row: answered by the model's classification head (one logit per
    label; rerank reads the first), not by pooling."""

    encoded: Encoded


@runtime_checkable
class TextEmbedder(Protocol):
    """`/v1/embeddings` over text: tokenize, one row per input (payload: the `Encoded`), one
    vector of `dimensions` floats per row."""

    dimensions: int
    normalized: bool
    max_input_tokens: int

    def tokenize(self, texts: Sequence[str], *, truncate: bool) -> list[Encoded]: ...


@runtime_checkable
class PromptedEmbedder(Protocol):
    """A text embedder whose package declares prompts (sentence-transformers' `prompts`): requests
    pick one with `input_type` or `prompt_name`, else `default_prompt_name` applies."""

    prompts: dict[str, str]
    default_prompt_name: str | None


@runtime_checkable
class TextClassifier(Protocol):
    """`/v1/classify`: one row per input or overflow window (payload: `LogitsRow`), one logit
    per label."""

    labels: list[str]
    multi_label: bool
    max_input_tokens: int
    tokenizer: TextTokenizer


@runtime_checkable
class PairScorer(Protocol):
    """`/v1/rerank`: one (query, document) row per document (payload: `LogitsRow`), one logit."""

    max_input_tokens: int
    tokenizer: TextTokenizer


@runtime_checkable
class QuestionAnswerer(Protocol):
    """`/v1/decisions` (and the SystemOne paths): prepared questions in, answer-token
    probabilities out (rows laid out by `families/decision_rows.rows_for`)."""

    cache_tag: str

    def prepare(self, state: Any, questions: Sequence[AskedQuestion]) -> PreparedState: ...

    def share(self, prepared: PreparedState) -> bool: ...


@runtime_checkable
class MediaEmbedder(Protocol):
    """`/v1/embeddings` image and video items, on top of `TextEmbedder`'s text. Each image is one
    row of the `media_lane` counting `image_tokens` (payload: the float32 [3, H, W] pixels the
    `MediaLoader` made with `preprocess`); a video is `frames` such rows, sampled uniformly over
    its duration (default `video_frames`, at most `video_limits.max_frames`). One vector per row;
    the surface mean-pools a video's frame vectors (and normalizes them when `normalized`).
    Every limit is checked before a forward is spent."""

    modalities: frozenset[str]  # of "text", "image", "video"
    media_lane: str
    image_tokens: int
    image_limits: MediaLimits
    video_limits: MediaLimits
    video_frames: int
    preprocess: Any  # what the decoder does to every image and frame (`media/preprocess.ImagePreprocess`)


@dataclass(frozen=True)
class SurfaceContract:
    """What a model that lists a surface implements (`required`), and the extensions it may add
    (e.g. `MediaEmbedder` on embeddings: a text-only encoder is complete without it)."""

    required: type
    extensions: tuple[type, ...] = ()


SURFACE_CONTRACTS: dict[str, SurfaceContract] = {
    "embeddings": SurfaceContract(TextEmbedder, (MediaEmbedder,)),
    "classify": SurfaceContract(TextClassifier),
    "rerank": SurfaceContract(PairScorer),
    "decisions": SurfaceContract(QuestionAnswerer),
}


def surface_contract_problems(model: LoadedModel) -> list[str]:
    """One line per listed surface whose contract MODEL does not implement (or that is unknown),
    and one when it says it reads media (`modalities`) without implementing `MediaEmbedder`."""
    problems = []
    for surface in sorted(model.surfaces):
        contract = SURFACE_CONTRACTS.get(surface)
        if contract is None:
            problems.append(f"lists unknown surface {surface!r} (known: {', '.join(sorted(SURFACE_CONTRACTS))})")
        elif not isinstance(model, contract.required):
            problems.append(f"lists surface {surface!r} but does not implement {contract.required.__name__}")
    media = set(getattr(model, "modalities", ())) - {"text"}
    if media and not isinstance(model, MediaEmbedder):
        problems.append(f"reads {', '.join(sorted(media))} but does not implement MediaEmbedder")
    return problems


# ---- stores (the media ports live in `media/ports.py` and are exported from here) -------------
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
