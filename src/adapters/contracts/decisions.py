"""What the decisions surface and a question-answering family exchange (R-API-4/5, R-SC): the
questions asked, the family's prepared state, and the rows the scheduler runs.

The surface turns a request into `AskedQuestion`s, the family (`QuestionAnswerer.prepare`)
tokenizes them into a `PreparedState` whose questions carry their rendering or their
`QuestionError`, the family decides the layout (`QuestionAnswerer.share`), and `rows_for` lays
the state out as `QuestionRow` / `SharedRow` payloads, which the family's `run` reads. The
layout lives here because both sides read it.

A state may hold images and videos (`StateMedium`, decoded once by the media loader and shared
by every row that reads them): its prepared ids then hold each medium's placeholder tokens, and
every row that reads it carries the media and goes to the `media` lane (R-BAT-6), whether it is
one question (unshared) or the state and all its questions (shared).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm_srun.domain.scheduling.rows import DEFAULT_LANE, RowSpec
from vllm_srun.domain.scheduling.shared_context import SHARED_LANE, shared_row_tokens

MEDIA_LANE = "media"  # rows that read images or videos, shared or not (R-BAT-6)

__all__ = [
    "MEDIA_LANE",
    "AskedQuestion",
    "PreparedQuestion",
    "PreparedState",
    "QuestionError",
    "QuestionRow",
    "RenderedQuestion",
    "SharedRow",
    "StateMedium",
    "content_text",
    "probabilities_per_question",
    "rows_for",
]


def content_text(value: Any) -> str:
    """A state, instruction or description as the model reads it: strings as they are,
    objects/arrays as JSON (span offsets count code points of this text)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


class QuestionError(Exception):
    """A question that cannot be answered; it fails in place (R-API-5)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class AskedQuestion:
    name: str
    kind: str  # noul | choice | score | box
    instructions: object = None  # the request's text or content parts, as sent
    criteria: object = None  # noul: {true, false}; choice: option → text; score: the levels


@dataclass(frozen=True)
class RenderedQuestion:
    body: str
    answer_keys: tuple[str, ...]  # the text of each answer token (without the template's answer prefix)
    labels: tuple[str, ...]  # what each answer is called in the response (choice: criteria keys; score: "0"..)
    legend: dict[str, object] | None = None  # score: level → its criteria entry


@dataclass
class PreparedQuestion:
    name: str
    kind: str
    ids: tuple[int, ...] = ()
    answer_ids: tuple[int, ...] = ()
    rendered: RenderedQuestion | None = None
    error: QuestionError | None = None


@dataclass(frozen=True, eq=False)
class StateMedium:
    """One image or video of a state, as the model reads it: preprocessed pixels (read-only,
    shared with the decode cache and by every row that reads the state), the SHA-256 of the bytes
    they were decoded from, and (a video) each sampled frame's time in seconds."""

    kind: str  # image | video
    pixels: Any  # float32 [3, H, W] (image) or [frames, 3, H, W] (video)
    digest: bytes
    times: tuple[float, ...] = ()


@dataclass
class PreparedState:
    state_ids: tuple[int, ...]  # the state part: its media's placeholder tokens included
    questions: list[PreparedQuestion] = field(default_factory=list)
    media: tuple[StateMedium, ...] = ()  # in the order of their placeholders in state_ids

    @property
    def answerable(self) -> list[PreparedQuestion]:
        return [q for q in self.questions if q.error is None]

    @property
    def input_tokens(self) -> int:
        """The state once plus every answerable question (R-SC-1), whichever layout runs."""
        ok = self.answerable
        return len(self.state_ids) + sum(len(q.ids) for q in ok) if ok else 0


@dataclass(frozen=True, slots=True)
class QuestionRow:
    """A prompt's token ids (unshared: state + question; inside a SharedRow: the question part only)
    and, unshared, the state's media its ids hold placeholders for and how many of its ids are
    the state's (None: not said; a model's `attention_mode` may treat the state apart)."""

    ids: tuple[int, ...]
    answer_ids: tuple[int, ...]
    media: tuple[StateMedium, ...] = ()
    state_length: int | None = None


@dataclass(frozen=True, slots=True)
class SharedRow:
    state_ids: tuple[int, ...]
    questions: tuple[QuestionRow, ...]
    media: tuple[StateMedium, ...] = ()  # the state's, read once with it


def rows_for(prepared: PreparedState, shared: bool) -> list[RowSpec]:
    """The scheduler rows of one prepared state (answerable questions only, in order): unshared,
    one `text`-lane row per question holding the whole prompt; shared, one `shared`-lane row
    holding the state once and every question after it. A state with media puts either layout's
    rows in the `media` lane, each carrying the media (unshared: every row the state's)."""
    ok = prepared.answerable
    if not ok:
        return []
    state, media = prepared.state_ids, prepared.media
    if shared:
        lengths = [len(q.ids) for q in ok]
        payload = SharedRow(state, tuple(QuestionRow(q.ids, q.answer_ids) for q in ok), media)
        return [RowSpec(shared_row_tokens(len(state), lengths), payload, MEDIA_LANE if media else SHARED_LANE)]
    lane = MEDIA_LANE if media else DEFAULT_LANE
    return [
        RowSpec(len(state) + len(q.ids), QuestionRow(state + q.ids, q.answer_ids, media, len(state)), lane) for q in ok
    ]


def probabilities_per_question(rows: Sequence[RowSpec], outputs: Sequence[object]) -> list[object]:
    """Flatten row outputs back to one probability vector per answerable question, in order (a
    shared row's output holds one vector per question)."""
    flat: list[object] = []
    for spec, out in zip(rows, outputs):
        if isinstance(spec.payload, SharedRow):
            if not isinstance(out, Iterable):
                raise TypeError(f"a shared row answers one vector per question, not a {type(out).__name__}")
            flat.extend(out)
        else:
            flat.append(out)
    return flat
