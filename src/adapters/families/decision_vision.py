"""Decision models that read images and videos (R-PKG-2, R-BAT-6, R-MEDIA): a Qwen3.5 package with
its vision tower (`vision_config`) and processor files (`preprocessor_config.json`, optionally
`video_preprocessor_config.json`).

- **Requests**: a state's images and videos (`surfaces/decision_media.py`) are decoded by the
  media workers with the package's `VisionPreprocess` (`media/qwen_vision.py`) within the limits
  below, and written in front of the state's text as their placeholders (`MediaPrompt`): an
  image `<|vision_start|>` + one `<|image_pad|>` per token + `<|vision_end|>`; a video, for every
  group of `temporal_patch_size` frames, `<t seconds>` then the same with `<|video_pad|>`. The
  placeholder tokens are reserved: a state or question text that holds one fails its questions
  (`invalid_question`), so the tower's features always land on the tokens meant for them.
- **Lanes** (R-BAT-6): `text` (unshared text rows), `shared` (shared text-only states) and
  `media`: every row that reads media, one question with the state's media (unshared) or the
  state and its media once with every question as a branch (shared, R-SC); packed, with its own
  cost per token, so a text row never waits in an image forward and a text forward's cost is never
  an image's.
- **Limits** (card `limits`): images PNG, JPEG or WebP of at most 8,000,000 bytes and 16,000,000
  pixels (read at up to the processor's `max_pixels`); videos MP4/QuickTime or Matroska/WebM of at
  most 32,000,000 bytes, 300 s and 3840 × 2160 pixels a frame, sampled at the processor's rate
  (2 a second) into 4 to 32 frames; a request's videos at most 16,384 tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from vllm_srun.adapters.contracts import (
    MEDIA_LANE,
    AskedQuestion,
    LoadContext,
    MediaLimits,
    PreparedState,
    QuestionError,
    QuestionRow,
    SharedRow,
    StateMedium,
)
from vllm_srun.adapters.families.decision_model import BRANCH_CHUNK, CPU_CAP_TOKENS, DecisionModel, _restricted
from vllm_srun.adapters.families.decision_rows import PromptTokens
from vllm_srun.adapters.media.qwen_vision import (
    IMAGE_PAD,
    VIDEO_PAD,
    VISION_END,
    VISION_START,
    VisionPreprocess,
    image_placeholder,
    video_group_times,
    video_placeholder,
)
from vllm_srun.domain.inputs import media as rules
from vllm_srun.domain.scheduling.lanes import Accounting, Lane
from vllm_srun.domain.worker.calibration import TIME_CAP_S

RESERVED = (VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD)
MODALITIES = frozenset({"text", "image", "video"})


def reads_media(folder: Path) -> bool:
    """Whether a decision package has a vision tower to read images with: a Qwen3.5 `config.json`
    with its `vision_config`, and the processor's `preprocessor_config.json`. One rule, the one
    `load_lm` reads the vision LM by (`qwen3_5_mm.reads_media`), imported here only when asked."""
    from vllm_srun.adapters.models.qwen3_5_mm import reads_media as has_vision_tower

    return has_vision_tower(folder)


def image_limits() -> MediaLimits:
    return MediaLimits(
        max_bytes=rules.DECISION_IMAGE_MAX_BYTES,
        max_pixels=rules.DECISION_IMAGE_SOURCE_MAX_PIXELS,
        formats=rules.DECISION_IMAGE_FORMATS,
    )


def video_limits(spec: VisionPreprocess) -> MediaLimits:
    return MediaLimits(
        max_bytes=rules.DECISION_VIDEO_MAX_BYTES,
        max_pixels=rules.DECISION_VIDEO_SOURCE_MAX_PIXELS,
        max_frames=spec.video_max_frames,
        max_duration_s=rules.DECISION_VIDEO_MAX_SECONDS,
        max_decoded_frames=rules.DECISION_VIDEO_MAX_DECODED_FRAMES,
        formats=rules.DECISION_VIDEO_FORMATS,
    )


class MediaPrompt:
    """How a state's media are written into its prompt, and the tokens they take (module doc)."""

    def __init__(self, tokens: PromptTokens, spec: VisionPreprocess) -> None:
        missing = [t for t in RESERVED if not tokens.has_token(t)]
        if missing:
            raise ValueError(f"the tokenizer has no {', '.join(missing)} token: it cannot stand for images")
        self.tokens = tokens
        self.spec = spec
        ids = [tokens.tokenizer.token_to_id(t) for t in RESERVED]
        self.reserved = frozenset(i for i in ids if i is not None)

    def media_tokens(self, kind: str, shape: tuple[int, ...]) -> int:
        """The pad tokens of one medium of KIND whose pixels have SHAPE."""
        groups, per_group = self.spec.tokens(kind, shape)
        return int(groups * per_group)

    def min_media_tokens(self, kind: str) -> int:
        """A lower bound of the tokens any medium of KIND takes (each side at least one factor)."""
        if kind == "image":
            s = self.spec.image
            return max(1, s.min_pixels // (s.factor * s.factor))
        s = self.spec.video
        groups = -(-self.spec.video_min_frames // s.temporal)
        return max(groups, s.min_pixels // (s.temporal * s.factor * s.factor))

    def max_media_tokens(self, kind: str) -> int:
        """An upper bound of the tokens one medium of KIND takes, its placeholder's own included: an
        image at the processor's most pixels; a video of the most frames, each as large as a 4K
        frame may be made (`<t seconds>` counted as 8 tokens a group)."""
        if kind == "image":
            s = self.spec.image
            return s.max_pixels // (s.factor * s.factor) + 2
        frames = self.spec.video_max_frames
        height, width = self.spec.video_size(frames, 2160, 3840)
        groups, per_group = self.spec.tokens("video", (frames, 3, height, width))
        return min(rules.DECISION_VIDEO_MAX_TOKENS, groups * per_group) + groups * 10

    def text(self, media: Sequence[StateMedium]) -> str:
        """The placeholders of MEDIA, in order."""
        out = []
        for m in media:
            groups, per_group = self.spec.tokens(m.kind, tuple(m.pixels.shape))
            if m.kind == "image":
                out.append(image_placeholder(per_group))
            else:
                out.append(video_placeholder(per_group, video_group_times(m.times, self.spec.video.temporal)[:groups]))
        return "".join(out)

    def reserved_in(self, ids: Sequence[int]) -> int:
        return sum(1 for i in ids if i in self.reserved)

    def check(self, prepared: PreparedState, media_text: str) -> PreparedState:
        """Fail the questions of a state whose text, or whose own text, holds a placeholder token."""
        (expected,) = self.tokens.encode([media_text]) if media_text else [()]
        if self.reserved_in(prepared.state_ids) != self.reserved_in(expected):
            error = QuestionError(
                "invalid_question",
                f"the state's text holds a token these models keep for images and videos ({', '.join(RESERVED)})",
            )
            for q in prepared.questions:
                q.error = q.error or error
            return prepared
        for q in prepared.questions:
            if q.error is None and self.reserved_in(q.ids):
                q.error = QuestionError(
                    "invalid_question",
                    f"the question's text holds a token these models keep for images and videos ({', '.join(RESERVED)})",
                )
        return prepared


@runtime_checkable
class MediaDecoderEngine(Protocol):
    """What the media lane needs of the decoder engine (the Qwen3.5 vision LM's)."""

    def media_logits(self, rows: Sequence[tuple[Sequence[int], Sequence[StateMedium]]]) -> Any:
        """Next-token logits at each row's last token, [rows, vocab]; a row's media fill its placeholders."""
        ...

    def prefix_kv(self, state_ids: Sequence[int], media: Sequence[StateMedium] = ()) -> Any: ...


class VisionDecisionModel(DecisionModel):
    """A decision model that reads images and videos (module doc): a `MediaQuestionAnswerer`."""

    media_lane = MEDIA_LANE
    modalities = MODALITIES

    def __init__(self, folder: Path, context: LoadContext) -> None:
        super().__init__(folder, context)
        if not isinstance(self.decoder_engine, MediaDecoderEngine):
            raise ValueError(f"the {self.decoder_engine.name} engine runs no vision tower; this package reads images")
        self.preprocess = VisionPreprocess.from_folder(folder)
        self.image_limits = image_limits()
        self.video_limits = video_limits(self.preprocess)
        self.max_video_tokens = rules.DECISION_VIDEO_MAX_TOKENS
        self.prompt = MediaPrompt(self.tokens, self.preprocess)
        cpu = self.device.kind == "cpu"
        self.lanes = (
            *self.lanes,
            Lane(
                MEDIA_LANE,
                Accounting.PACKED,
                cap_tokens=CPU_CAP_TOKENS if cpu else None,
                cap_seconds=None if cpu else TIME_CAP_S,
            ),
        )

    # ---- requests ---------------------------------------------------------------------------
    def media_tokens(self, kind: str, shape: tuple[int, ...]) -> int:
        return self.prompt.media_tokens(kind, shape)

    def min_media_tokens(self, kind: str) -> int:
        return self.prompt.min_media_tokens(kind)

    def max_media_tokens(self, kind: str) -> int:
        return self.prompt.max_media_tokens(kind)

    def prepare(
        self,
        state: Any,
        questions: Sequence[AskedQuestion],
        overflow: str | None = None,
        media: Sequence[StateMedium] = (),
        replay: bool = False,
    ) -> PreparedState:
        media_text = self.prompt.text(media)
        prepared = self._prepare(state, questions, overflow, media, media_text, replay=replay)
        return self.prompt.check(prepared, media_text)

    # ---- forwards (device thread) -----------------------------------------------------------
    def run(self, lane: str, payloads: Sequence[Any]) -> Sequence[Any]:
        if lane != MEDIA_LANE:
            return super().run(lane, payloads)
        return run_media(self.decoder_engine, payloads)

    def warm_up(self) -> None:
        super().warm_up()
        size = self.preprocess.image_size(64, 64)
        pixels = np.zeros((3, *size), dtype=np.float32)
        medium = StateMedium("image", pixels, b"warm-up")
        prepared = self.prepare("warm up", [AskedQuestion("q", "noul", "ok?")], media=[medium])
        q = prepared.questions[0]
        if q.error is None:
            state = prepared.state_ids
            self.run(MEDIA_LANE, [QuestionRow(state + q.ids, q.answer_ids, (medium,), len(state))])

    def card_section(self) -> dict[str, Any]:
        card = super().card_section()
        spec = self.preprocess
        card["modalities"] = sorted(self.modalities)
        card["limits"] = {**card["limits"], **media_limits_card(spec, self.image_limits, self.video_limits)}
        card["media"] = {"lane": MEDIA_LANE, "preprocess": spec.key()}
        return card


def media_limits_card(spec: VisionPreprocess, image: MediaLimits, video: MediaLimits) -> dict[str, Any]:
    """The card's `limits` of a model that reads images and videos (the contract's `image_*`, ours `video_*`)."""
    return {
        "image_max_pixels": spec.image.max_pixels,
        "image_source_max_pixels": image.max_pixels,
        "image_max_bytes": image.max_bytes,
        "video_fps": spec.video_rate,
        "video_min_frames": spec.video_min_frames,
        "video_max_frames": spec.video_max_frames,
        "video_max_pixels": spec.video.max_pixels,
        "video_max_tokens": rules.DECISION_VIDEO_MAX_TOKENS,
        "video_max_bytes": video.max_bytes,
        "video_max_seconds": video.max_duration_s,
        "video_source_max_pixels": video.max_pixels,
    }


def run_media(decoder: Any, payloads: Sequence[Any]) -> list[Any]:
    """The media lane's forward: the unshared rows in one call (back to back), each shared row's
    state and media once with its questions as branches; outputs in payload order."""
    from vllm_srun.adapters.models.qwen3_5_mm import MediaRow

    out: list[Any] = [None] * len(payloads)
    single = [i for i, p in enumerate(payloads) if isinstance(p, QuestionRow)]
    if single:
        rows = [payloads[i] for i in single]
        logits = decoder.media_logits([MediaRow(r.ids, r.media, r.state_length) for r in rows])
        for i, probs in zip(single, _restricted(logits, [r.answer_ids for r in rows])):
            out[i] = probs
    for i, p in enumerate(payloads):
        if isinstance(p, SharedRow):
            state = decoder.prefix_kv(p.state_ids, media=p.media)
            logits = decoder.branch_logits(state, [q.ids for q in p.questions], chunk=BRANCH_CHUNK)
            out[i] = _restricted(logits, [q.answer_ids for q in p.questions])
    return out


__all__ = ["MediaPrompt", "VisionDecisionModel", "reads_media", "run_media"]
