"""The contracts between the serving core and everything that plugs into it.

The serving core (`adapters/serving`, `adapters/readiness`, `adapters/http`, `adapters/surfaces`)
relies on these declarations and on nothing else of a family or an engine:

- a **family** plugin (`Family`, `family.py`) recognises a package, describes it without loading
  weights, and loads it into a `LoadedModel`: the surfaces it serves, its lanes, its forward
  (`run`), warm-up, probe rows, golden file and card section;
- the loaded model runs its forwards on an **engine** (`Engine`, `engine.py`; the encoder family's
  in one call per planned forward over a plain `Batch`, `batch.py`), built by an engine
  plugin (`EnginePlugin`) that the family asks for through `LoadContext.build_engine`; a family
  never imports an engine module; how an engine honours `--deterministic` is a `Determinism`;
- on a **device** (`Device`, `device.py`): kind, index, memory, native dtypes, synchronize;
- packages come from a **model store** (`ModelStore`), time from the domain's `Clock`;
- each **surface** states what it needs of a model as a Protocol of its own (`surfaces.py`:
  `TextEmbedder`, `TextClassifier`, `PairScorer`, `QuestionAnswerer`, `MediaEmbedder` for
  image and video items), checked at load (`surface_contract_problems`) and, on every request,
  through a `Capability` that remembers the answer per model (`is_text_embedder`, …;
  `capability.py`); the decisions surface and its family exchange the types of `decisions.py`;
- **media** inputs (images, videos) are decoded by a `MediaDecoder` given `ImageJob`s and
  `VideoJob`s (in media worker processes or a thread), reached from the event loop through a
  `MediaLoader` that keeps the decode cache (`media.py`).

This package imports no implementation: only the standard library and the pure domain (array,
tensor and tokenizer types are named for the type checker only), so the implementations depend
on it and never the other way (`lint-imports`). Families and engines are found through package
entry points (`adapters/plugins.py`); the composition roots (`app/bootstrap.py`) wire the rest.
Fakes of every contract live in `tests/fakes.py`, `tests/fake_family.py` and
`tests/fake_media.py`; `docs/design.md` walks through adding a family or an engine.
"""

from vllm_srun.adapters.contracts.batch import Ask, Batch, BatchOutputs
from vllm_srun.adapters.contracts.common import CardFields, Clock, Encoded, PluginCard, Progress, quiet
from vllm_srun.adapters.contracts.decisions import (
    MEDIA_LANE,
    AskedQuestion,
    PreparedQuestion,
    PreparedState,
    QuestionError,
    QuestionRow,
    RenderedQuestion,
    SharedRow,
    StateMedium,
    probabilities_per_question,
    rows_for,
)
from vllm_srun.adapters.contracts.device import Device, ThreadContext
from vllm_srun.adapters.contracts.engine import (
    AudioEncoderEngine,
    DecoderEngine,
    Determinism,
    DevicePreflight,
    DualEncoderEngine,
    EncoderEngine,
    Engine,
    EngineCatalog,
    EnginePlugin,
    EngineRefused,
    EngineRequest,
    EngineSelector,
    EngineSettings,
    PrefixState,
    SettingRefusal,
    SettingsPreflight,
    as_audio_encoder_engine,
    as_decoder_engine,
    as_dual_encoder_engine,
    as_encoder_engine,
)
from vllm_srun.adapters.contracts.family import (
    MANIFEST,
    CalibrationForward,
    Family,
    FamilyFinder,
    LoadContext,
    LoadedModel,
    ModelStore,
    Numerics,
    PackageInfo,
)
from vllm_srun.adapters.contracts.media import (
    AudioDecoder,
    AudioJob,
    ClipDecoder,
    ClipJob,
    ImageJob,
    MediaDecoder,
    MediaError,
    MediaJob,
    MediaLimits,
    MediaLoader,
    MediaWorkerDied,
    PixelSpec,
    SampledVideo,
    VideoJob,
    VisionPreprocess,
    decode,
)
from vllm_srun.adapters.contracts.surfaces import (
    SURFACE_CONTRACTS,
    AudioEmbedder,
    LogitsRow,
    MediaEmbedder,
    MediaQuestionAnswerer,
    PairScorer,
    PromptedEmbedder,
    QuestionAnswerer,
    RowTokenizer,
    SurfaceContract,
    TextClassifier,
    TextEmbedder,
    is_audio_embedder,
    is_media_embedder,
    is_media_question_answerer,
    is_pair_scorer,
    is_prompted_embedder,
    is_question_answerer,
    is_text_classifier,
    is_text_embedder,
    surface_contract_problems,
)

__all__ = [
    "MANIFEST",
    "MEDIA_LANE",
    "SURFACE_CONTRACTS",
    "Ask",
    "AskedQuestion",
    "AudioDecoder",
    "AudioEmbedder",
    "AudioEncoderEngine",
    "AudioJob",
    "Batch",
    "BatchOutputs",
    "CalibrationForward",
    "CardFields",
    "ClipDecoder",
    "ClipJob",
    "Clock",
    "DecoderEngine",
    "Determinism",
    "Device",
    "DevicePreflight",
    "DualEncoderEngine",
    "Encoded",
    "EncoderEngine",
    "Engine",
    "EngineCatalog",
    "EnginePlugin",
    "EngineRefused",
    "EngineRequest",
    "EngineSelector",
    "EngineSettings",
    "Family",
    "FamilyFinder",
    "ImageJob",
    "LoadContext",
    "LoadedModel",
    "LogitsRow",
    "MediaDecoder",
    "MediaEmbedder",
    "MediaError",
    "MediaJob",
    "MediaLimits",
    "MediaLoader",
    "MediaQuestionAnswerer",
    "MediaWorkerDied",
    "ModelStore",
    "Numerics",
    "PackageInfo",
    "PairScorer",
    "PixelSpec",
    "PluginCard",
    "PrefixState",
    "PreparedQuestion",
    "PreparedState",
    "Progress",
    "PromptedEmbedder",
    "QuestionAnswerer",
    "QuestionError",
    "QuestionRow",
    "RenderedQuestion",
    "RowTokenizer",
    "SampledVideo",
    "SettingRefusal",
    "SettingsPreflight",
    "SharedRow",
    "StateMedium",
    "SurfaceContract",
    "TextClassifier",
    "TextEmbedder",
    "ThreadContext",
    "VideoJob",
    "VisionPreprocess",
    "as_audio_encoder_engine",
    "as_decoder_engine",
    "as_dual_encoder_engine",
    "as_encoder_engine",
    "decode",
    "is_audio_embedder",
    "is_media_embedder",
    "is_media_question_answerer",
    "is_pair_scorer",
    "is_prompted_embedder",
    "is_question_answerer",
    "is_text_classifier",
    "is_text_embedder",
    "probabilities_per_question",
    "quiet",
    "rows_for",
    "surface_contract_problems",
]
