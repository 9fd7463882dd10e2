"""Decision requests → rows (R-BAT-1, R-SC, R-LEN): tokenized prompts, limits, and the two layouts.

`prepare` turns one state and its questions into token ids: the state part once, each question
part on its own, and each question's answer tokens. A question that is invalid or whose prompt
(state part + question part) is longer than the model's limit fails here, in place, before any
forward; a prompt exactly at the limit is read.

`rows_for` lays a prepared state out for the scheduler: unshared, one `text`-lane row per
question holding the whole prompt; shared (decided by `domain.shared_context.should_share`), one
`shared`-lane row holding the state once and every question after it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tokenizers import Tokenizer

from vllm_srun.adapters.families.decision_prompts import (
    PromptTemplate,
    QuestionError,
    RenderedQuestion,
    content_text,
    render_question,
)
from vllm_srun.domain.rows import DEFAULT_LANE, RowSpec
from vllm_srun.domain.shared_context import SHARED_LANE, shared_row_tokens


@dataclass(frozen=True, slots=True)
class QuestionRow:
    """A prompt's token ids (unshared: state + question; inside a SharedRow: the question part only)."""

    ids: tuple[int, ...]
    answer_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class SharedRow:
    state_ids: tuple[int, ...]
    questions: tuple[QuestionRow, ...]


@dataclass(frozen=True, slots=True)
class AskedQuestion:
    name: str
    kind: str  # noul | choice | score | box
    instructions: Any = None
    criteria: Any = None


@dataclass
class PreparedQuestion:
    name: str
    kind: str
    ids: tuple[int, ...] = ()
    answer_ids: tuple[int, ...] = ()
    rendered: RenderedQuestion | None = None
    error: QuestionError | None = None


@dataclass
class PreparedState:
    state_ids: tuple[int, ...]
    questions: list[PreparedQuestion] = field(default_factory=list)

    @property
    def answerable(self) -> list[PreparedQuestion]:
        return [q for q in self.questions if q.error is None]

    @property
    def input_tokens(self) -> int:
        """The state once plus every answerable question (R-SC-1), whichever layout runs."""
        ok = self.answerable
        return len(self.state_ids) + sum(len(q.ids) for q in ok) if ok else 0


class PromptTokens:
    """The tokenizer side of prompts: ids without added special tokens, single-token answer keys."""

    def __init__(self, tokenizer: Tokenizer, template: PromptTemplate, bos: str = "") -> None:
        tokenizer.no_padding()
        tokenizer.no_truncation()
        self.tokenizer = tokenizer
        self.template = template
        self.bos = bos
        self._single: dict[str, int | None] = {}

    def has_token(self, token: str) -> bool:
        return self.tokenizer.token_to_id(token) is not None

    def encode(self, texts: Sequence[str]) -> list[tuple[int, ...]]:
        return [tuple(e.ids) for e in self.tokenizer.encode_batch(list(texts), add_special_tokens=False)]

    def single(self, key: str) -> int | None:
        """The id of the answer token KEY (after the template's answer prefix), when it is one token."""
        if key not in self._single:
            ids = self.tokenizer.encode(self.template.answer_prefix + key, add_special_tokens=False).ids
            self._single[key] = ids[0] if len(ids) == 1 else None
        return self._single[key]


LimitMessage = Callable[[int], str]


def prepare(
    tokens: PromptTokens,
    state: Any,
    questions: Sequence[AskedQuestion],
    max_input_tokens: int,
    limit_message: LimitMessage,
) -> PreparedState:
    template = tokens.template
    (state_ids,) = tokens.encode([template.state_part(content_text(state), tokens.bos)])
    out = PreparedState(state_ids)
    bodies: list[str] = []
    for asked in questions:
        item = PreparedQuestion(asked.name, asked.kind)
        out.questions.append(item)
        try:
            item.rendered = render_question(asked.kind, asked.instructions, asked.criteria, tokens.single)
            singles = [tokens.single(k) for k in item.rendered.answer_keys]
            answer_ids = [i for i in singles if i is not None]
            if len(answer_ids) != len(singles) or len(set(answer_ids)) != len(answer_ids):
                raise QuestionError(
                    "invalid_question",
                    "this model's tokenizer has no single distinct token for each "
                    f"answer ({', '.join(item.rendered.answer_keys)})",
                )
            item.answer_ids = tuple(answer_ids)
            bodies.append(template.question_part(item.rendered.body, tokens.bos))
        except QuestionError as exc:
            item.error = exc
    ready = [q for q in out.questions if q.error is None]
    for item, ids in zip(ready, tokens.encode(bodies) if bodies else []):
        item.ids = ids
        total = len(state_ids) + len(ids)
        if not ids:
            item.error = QuestionError("invalid_question", "the question part of the prompt has no tokens")
        elif total > max_input_tokens:
            item.error = QuestionError("max_length_exceeded", f"the prompt has {total} tokens, {limit_message(total)}")
    return out


def rows_for(prepared: PreparedState, shared: bool) -> list[RowSpec]:
    """The scheduler rows of one prepared state (answerable questions only, in order)."""
    ok = prepared.answerable
    if not ok:
        return []
    state = prepared.state_ids
    if shared:
        lengths = [len(q.ids) for q in ok]
        payload = SharedRow(state, tuple(QuestionRow(q.ids, q.answer_ids) for q in ok))
        return [RowSpec(shared_row_tokens(len(state), lengths), payload, SHARED_LANE)]
    return [RowSpec(len(state) + len(q.ids), QuestionRow(state + q.ids, q.answer_ids), DEFAULT_LANE) for q in ok]


def probabilities_per_question(rows: Sequence[RowSpec], outputs: Sequence[Any]) -> list[Any]:
    """Flatten row outputs back to one probability vector per answerable question, in order."""
    flat: list[Any] = []
    for spec, out in zip(rows, outputs):
        if isinstance(spec.payload, SharedRow):
            flat.extend(out)
        else:
            flat.append(out)
    return flat
