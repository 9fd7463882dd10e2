"""What each surface (`/v1/embeddings`, `/v1/classify`, `/v1/rerank`, `/v1/decisions`) needs of a
model, as a Protocol of its own, plus the extensions a model may add (`MediaEmbedder`: image and
video items on `/v1/embeddings`; `AudioEmbedder`: audio items; `MediaQuestionAnswerer`: images and
videos of a decision state). A model that lists a surface implements it, and the runtime
checks that at load (`surface_contract_problems`), so a family that forgets one fails to load
with a reason instead of failing requests.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from vllm_srun.adapters.contracts.capability import Capability
from vllm_srun.adapters.contracts.common import Encoded
from vllm_srun.adapters.contracts.decisions import AskedQuestion, PreparedState, StateMedium
from vllm_srun.adapters.contracts.family import LoadedModel
from vllm_srun.adapters.contracts.media import MediaLimits, PixelSpec

if TYPE_CHECKING:  # types only
    from tokenizers import Tokenizer

__all__ = [
    "SURFACE_CONTRACTS",
    "AudioEmbedder",
    "LogitsRow",
    "MediaEmbedder",
    "MediaQuestionAnswerer",
    "PairScorer",
    "PromptedEmbedder",
    "QuestionAnswerer",
    "RowTokenizer",
    "SurfaceContract",
    "TextClassifier",
    "TextEmbedder",
    "is_audio_embedder",
    "is_media_embedder",
    "is_media_question_answerer",
    "is_pair_scorer",
    "is_prompted_embedder",
    "is_question_answerer",
    "is_text_classifier",
    "is_text_embedder",
    "surface_contract_problems",
]


@dataclass(frozen=True, slots=True)
class LogitsRow:
    """A classify or rerank row: answered by the model's classification head (one logit per
    label; rerank reads the first), not by pooling."""

    encoded: Encoded


class RowTokenizer(Protocol):
    """What the classify and rerank surfaces ask of a model's tokenizer
    (`models/tokenization.TextTokenizer`): texts and pairs → `Encoded` rows, never cut silently,
    and copies that cut an input into overflow windows."""

    windows_pairs: bool  # whether `windowing(..., pair=True)` can cut a pair's second text

    @property
    def tokenizer(self) -> Tokenizer:
        """The `tokenizers` tokenizer underneath (padding and truncation off)."""
        ...

    def encode(self, texts: Sequence[str], max_length: int | None = None, truncate: bool = False) -> list[Encoded]:
        """One row per text; longer than MAX_LENGTH: cut (TRUNCATE, flagged) or returned whole."""
        ...

    def encode_pairs(
        self, pairs: Sequence[tuple[str, str]], max_length: int | None = None, truncate: bool = False
    ) -> list[Encoded]: ...

    def windowing(self, length: int, overlap: int, pair: bool) -> tuple[Tokenizer, threading.Lock]:
        """A copy that cuts inputs into windows of LENGTH tokens sharing OVERLAP, and its lock."""
        ...


@runtime_checkable
class TextEmbedder(Protocol):
    """`/v1/embeddings` over text: tokenize, one row per input (payload: the `Encoded`), one
    vector of `dimensions` floats per row."""

    dimensions: int
    normalized: bool
    max_input_tokens: int

    def tokenize(self, texts: Sequence[str], *, truncate: bool, max_length: int | None = None) -> list[Encoded]:
        """One row per text; longer than MAX_LENGTH (None, or above it: `max_input_tokens`): cut
        when TRUNCATE (flagged), else returned whole."""
        ...


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
    tokenizer: RowTokenizer


@runtime_checkable
class PairScorer(Protocol):
    """`/v1/rerank`: one (query, document) row per document (payload: `LogitsRow`), one logit."""

    max_input_tokens: int
    tokenizer: RowTokenizer


@runtime_checkable
class QuestionAnswerer(Protocol):
    """`/v1/decisions` (and the SystemOne paths): prepared questions in, answer-token
    probabilities out (rows laid out by `contracts/decisions.rows_for`)."""

    cache_tag: str

    def prepare(
        self,
        state: object,
        questions: Sequence[AskedQuestion],
        overflow: str | None = None,
        media: Sequence[StateMedium] = (),
        replay: bool = False,
    ) -> PreparedState:
        """Tokenize STATE (the text the questions read) and each question; a question that
        cannot be asked carries its `QuestionError` instead of ids. OVERFLOW (`reject` or
        `truncate`) replaces the deployment's `input.overflow` for these questions (None: keep it).
        MEDIA (only for a `MediaQuestionAnswerer`) are read in front of the text, in order.
        REPLAY: the golden check's replay of recorded requests, read without the deployment's
        input budget (they were recorded without one)."""
        ...

    def share(self, prepared: PreparedState, allowed: bool = True) -> bool:
        """Whether the state runs once for all its questions (R-SC-2); never when the request's
        profile does not allow it (ALLOWED False: `Profile.shares_context`, R-PROF-1)."""
        ...


@runtime_checkable
class MediaQuestionAnswerer(Protocol):
    """`/v1/decisions` images and videos, on top of `QuestionAnswerer`: a state's media, decoded
    by the `MediaLoader` with `preprocess` (a `VisionPreprocess`: images as `ImageJob`s, videos as
    `ClipJob`s) within `image_limits` / `video_limits`, are given to `prepare` and read in front of
    the state's text; every row that reads them runs in `media_lane`. `modalities` names `text`
    and `image` (and `video` when it reads videos)."""

    modalities: frozenset[str]
    media_lane: str
    image_limits: MediaLimits
    video_limits: MediaLimits
    max_video_tokens: int  # the videos of one request together
    preprocess: PixelSpec

    def media_tokens(self, kind: str, shape: tuple[int, ...]) -> int:
        """Input tokens of one medium of KIND (image, video) whose pixels have SHAPE."""
        ...

    def min_media_tokens(self, kind: str) -> int:
        """The fewest input tokens any medium of KIND takes (checked before anything is decoded)."""
        ...

    def max_media_tokens(self, kind: str) -> int:
        """The most input tokens one medium of KIND may take (what admission counts it as)."""
        ...


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
    preprocess: PixelSpec  # what the decoder does to every image and frame


@runtime_checkable
class AudioEmbedder(Protocol):
    """`/v1/embeddings` `input_audio` items. Each audio file is one row of the `audio_lane`
    counting `audio_tokens` (payload: the float32 features the `MediaLoader` made with
    `audio_preprocess`: decoded, mono, resampled to the model's rate, log-mel); one vector per row.
    `modalities` names `audio` (and `text` when the model embeds texts in the same space);
    `audio_limits` bound the bytes and seconds, checked before a forward is spent."""

    modalities: frozenset[str]
    audio_lane: str
    audio_tokens: int
    audio_limits: MediaLimits
    audio_preprocess: PixelSpec


# the checks a surface makes on every request (`capability.py`: remembered per model)
is_text_embedder: Capability[TextEmbedder] = Capability(TextEmbedder)
is_prompted_embedder: Capability[PromptedEmbedder] = Capability(PromptedEmbedder)
is_text_classifier: Capability[TextClassifier] = Capability(TextClassifier)
is_pair_scorer: Capability[PairScorer] = Capability(PairScorer)
is_question_answerer: Capability[QuestionAnswerer] = Capability(QuestionAnswerer)
is_media_embedder: Capability[MediaEmbedder] = Capability(MediaEmbedder)
is_media_question_answerer: Capability[MediaQuestionAnswerer] = Capability(MediaQuestionAnswerer)
is_audio_embedder: Capability[AudioEmbedder] = Capability(AudioEmbedder)


@dataclass(frozen=True)
class SurfaceContract:
    """What a model that lists a surface implements (`required`), and the extensions it may add
    (e.g. `MediaEmbedder` on embeddings: a text-only encoder is complete without it)."""

    required: type
    extensions: tuple[type, ...] = ()


SURFACE_CONTRACTS: dict[str, SurfaceContract] = {
    "embeddings": SurfaceContract(TextEmbedder, (MediaEmbedder, AudioEmbedder)),
    "classify": SurfaceContract(TextClassifier),
    "rerank": SurfaceContract(PairScorer),
    "decisions": SurfaceContract(QuestionAnswerer, (MediaQuestionAnswerer,)),
}


def surface_contract_problems(model: LoadedModel) -> list[str]:
    """One line per listed surface whose contract MODEL does not implement (or that is unknown),
    and one when it says it reads media (`modalities`) without implementing `MediaEmbedder`
    (images, videos; `MediaQuestionAnswerer` for a decision model) or `AudioEmbedder` (audio)."""
    problems = []
    for surface in sorted(model.surfaces):
        contract = SURFACE_CONTRACTS.get(surface)
        if contract is None:
            problems.append(f"lists unknown surface {surface!r} (known: {', '.join(sorted(SURFACE_CONTRACTS))})")
        elif not isinstance(model, contract.required):
            problems.append(f"lists surface {surface!r} but does not implement {contract.required.__name__}")
    modalities = model.modalities
    media = modalities - {"text", "audio"}
    reader = MediaQuestionAnswerer if "decisions" in model.surfaces else MediaEmbedder
    if media and not isinstance(model, reader):
        problems.append(f"reads {', '.join(sorted(media))} but does not implement {reader.__name__}")
    if "audio" in modalities and not isinstance(model, AudioEmbedder):
        problems.append("reads audio but does not implement AudioEmbedder")
    return problems
