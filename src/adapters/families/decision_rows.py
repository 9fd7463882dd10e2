"""Decision requests → token ids (R-BAT-1, R-SC, R-LEN): tokenized prompts and their limits.

`prepare` turns one state and its questions into token ids: the state part once, each question
part on its own, and each question's answer tokens. A question that is invalid or whose prompt
(state part + question part) is longer than the model's limit fails here, in place, before any
forward; a prompt exactly at the limit is read.

The deployment's input budget (`input: {max_tokens, overflow}`, `domain/inputs/input_budget.py`) caps a
prompt below the model's limit as it caps a classify input: with `overflow: reject` (and
`window`: decisions have no windows) a prompt over `max_tokens` fails in place
(`max_length_exceeded`, naming `input.max_tokens`); with `truncate` the state's text is cut at
its end until the longest question's prompt fits, and only a question whose own part leaves no
room for the state still fails.

A state's media (`StateMedium`, decoded by the surface) are written in front of its text inside
the state part, as the text MEDIA_TEXT the model gives for them (its placeholder tokens): their
tokens count in every prompt's length, are never cut, and `usage` counts them with the state.

The types it fills and the two row layouts (`rows_for`: unshared, one `text`-lane row per
question; shared, decided by `domain.scheduling.shared_context.should_share`, one `shared`-lane row holding
the state once and every question after it) are the contract with the decisions surface
(`contracts/decisions.py`); they stay importable from here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tokenizers import Tokenizer

from vllm_srun.adapters.contracts import (
    AskedQuestion,
    PreparedQuestion,
    PreparedState,
    QuestionError,
    StateMedium,
)
from vllm_srun.adapters.contracts import QuestionRow as QuestionRow
from vllm_srun.adapters.contracts import SharedRow as SharedRow
from vllm_srun.adapters.contracts import probabilities_per_question as probabilities_per_question
from vllm_srun.adapters.contracts import rows_for as rows_for
from vllm_srun.adapters.families.decision_prompts import PromptTemplate, content_text, render_question
from vllm_srun.domain.inputs.input_budget import NO_BUDGET, InputBudget


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
    budget: InputBudget = NO_BUDGET,
    media: Sequence[StateMedium] = (),
    media_text: str = "",
) -> PreparedState:
    """STATE and QUESTIONS as token ids, each question within MAX_INPUTS_TOKENS and BUDGET; MEDIA
    (written as MEDIA_TEXT) in front of the state's text (module doc)."""
    template = tokens.template
    text = content_text(state)
    (state_ids,) = tokens.encode([template.state_part(media_text + text, tokens.bos)])
    out = PreparedState(state_ids, media=tuple(media))
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
    encoded = tokens.encode(bodies) if bodies else []
    limit = budget.limit(max_input_tokens)
    if budget.overflow == "truncate" and encoded:
        longest = max(len(ids) for ids in encoded)
        if len(state_ids) + longest > limit:
            out.state_ids = state_ids = cut_state(tokens, text, limit - longest, media_text)
    for item, ids in zip(ready, encoded):
        item.ids = ids
        total = len(state_ids) + len(ids)
        if not ids:
            item.error = QuestionError("invalid_question", "the question part of the prompt has no tokens")
        elif total > limit:
            why = (
                limit_message(total) if limit == max_input_tokens else f"over the deployment's input.max_tokens={limit}"
            )
            item.error = QuestionError("max_length_exceeded", f"the prompt has {total} tokens, {why}")
    return out


def cut_state(tokens: PromptTokens, text: str, room: int, media_text: str = "") -> tuple[int, ...]:
    """The state part's ids with TEXT cut at its end to fit ROOM tokens (the template's own
    tokens and the media's, MEDIA_TEXT, kept whole); the whole part when even an empty text does
    not fit (the questions then fail on their length)."""
    template, bos = tokens.template, tokens.bos
    (empty,) = tokens.encode([template.state_part(media_text, bos)])
    words = tokens.tokenizer.encode(text, add_special_tokens=False)
    keep = min(len(words.ids), room - len(empty))
    if keep < 0:
        (whole,) = tokens.encode([template.state_part(media_text + text, bos)])
        return whole
    while True:  # a cut may merge into other tokens at its edge: step back until it fits
        end = words.offsets[keep - 1][1] if keep > 0 else 0
        (ids,) = tokens.encode([template.state_part(media_text + text[:end], bos)])
        if len(ids) <= room or keep == 0:
            return ids
        keep -= 1
