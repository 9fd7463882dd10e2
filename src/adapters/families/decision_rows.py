"""Decision requests → token ids (R-BAT-1, R-SC, R-LEN): tokenized prompts and their limits.

`prepare` turns one state and its questions into token ids: the state part once, each question
part on its own, and each question's answer tokens. A question that is invalid or whose prompt
(state part + question part) is longer than the model's limit fails here, in place, before any
forward; a prompt exactly at the limit is read.

The types it fills and the two row layouts (`rows_for`: unshared, one `text`-lane row per
question; shared, decided by `domain.shared_context.should_share`, one `shared`-lane row holding
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
)
from vllm_srun.adapters.contracts import QuestionRow as QuestionRow
from vllm_srun.adapters.contracts import SharedRow as SharedRow
from vllm_srun.adapters.contracts import probabilities_per_question as probabilities_per_question
from vllm_srun.adapters.contracts import rows_for as rows_for
from vllm_srun.adapters.families.decision_prompts import PromptTemplate, content_text, render_question


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
