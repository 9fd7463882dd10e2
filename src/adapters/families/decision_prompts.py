"""Decision prompts (R-API-4): the package's prompt template, and how each question is written.

A prompt is two texts, tokenized separately and laid back to back: the *state part* (the
template's `state` with `{state}` filled in) and the *question part* (its `question` with
`{question}` filled in). The state part is the same for every question of a request, so shared
context (R-SC) runs it once; because the two parts are always tokenized apart, a question has
the same token ids whether it runs shared or alone.

`srun.json` may set `prompt_template: {state, question, system?, answer_prefix?}`; without one
the template follows the tokenizer's chat format, recognised by its special tokens (no chat
template code is run): ChatML (`<|im_start|>`: SmolLM2, Qwen2), ChatML with an empty thinking
block (Qwen3: `<think>`), Llama 3 (`<|start_header_id|>`), else a plain template ending in
`Answer:`. `{system}` and `{bos}` (the BOS token when the tokenizer config adds one) may appear in
either text. docs/decisions.md shows every default.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import product
from string import ascii_uppercase
from typing import Any

from vllm_srun.adapters.contracts import (  # what the surface reads (contracts/decisions.py)
    QuestionError,
    RenderedQuestion,
)
from vllm_srun.adapters.contracts.decisions import content_text as content_text

DEFAULT_SYSTEM = "You answer questions about the content the user gives. Reply with the answer only."

_CHATML_STATE = "{bos}<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{state}\n\n"
TEMPLATES: dict[str, dict[str, str]] = {
    "chatml": {"state": _CHATML_STATE, "question": "{question}<|im_end|>\n<|im_start|>assistant\n"},
    "chatml-think": {
        "state": _CHATML_STATE,
        "question": "{question}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    },
    "llama3": {
        "state": "{bos}<|start_header_id|>system<|end_header_id|>\n\n{system}<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\n{state}\n\n",
        "question": "{question}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    },
    "plain": {"state": "{bos}{state}\n\n", "question": "{question}\nAnswer:", "answer_prefix": " "},
}

MIN_OPTIONS, MAX_OPTIONS = 2, 255
MIN_LEVELS, MAX_LEVELS = 2, 10
# option keys when the criteria keys are not single tokens: A..Z, then AA, AB, .. ZZ (single tokens only)
OPTION_KEYS = tuple(ascii_uppercase) + tuple(a + b for a, b in product(ascii_uppercase, repeat=2))


@dataclass(frozen=True)
class PromptTemplate:
    name: str
    state: str
    question: str
    system: str = DEFAULT_SYSTEM
    answer_prefix: str = ""

    def __post_init__(self) -> None:
        if self.state.count("{state}") != 1:
            raise ValueError(f"prompt template {self.name!r}: `state` must contain {{state}} exactly once")
        if self.question.count("{question}") != 1:
            raise ValueError(f"prompt template {self.name!r}: `question` must contain {{question}} exactly once")

    def _fill(self, text: str, bos: str) -> str:
        return text.replace("{system}", self.system).replace("{bos}", bos)

    def state_part(self, state: str, bos: str = "") -> str:
        before, after = self.state.split("{state}")
        return self._fill(before, bos) + state + self._fill(after, bos)

    def question_part(self, body: str, bos: str = "") -> str:
        before, after = self.question.split("{question}")
        return self._fill(before, bos) + body + self._fill(after, bos)

    def as_dict(self) -> dict[str, str]:
        return {
            "name": self.name,
            "state": self.state,
            "question": self.question,
            "system": self.system,
            "answer_prefix": self.answer_prefix,
        }


def default_template_name(has_token: Callable[[str], bool]) -> str:
    if has_token("<|im_start|>") and has_token("<|im_end|>"):
        return "chatml-think" if has_token("<think>") and has_token("</think>") else "chatml"
    if has_token("<|start_header_id|>") and has_token("<|eot_id|>"):
        return "llama3"
    return "plain"


def choose_template(manifest_value: Any, has_token: Callable[[str], bool]) -> PromptTemplate:
    """The manifest's `prompt_template` (a default's name, or an object), else the tokenizer's default."""
    if manifest_value is None:
        name = default_template_name(has_token)
        return PromptTemplate(name, **TEMPLATES[name])
    if isinstance(manifest_value, str):
        if manifest_value not in TEMPLATES:
            raise ValueError(f"srun.json prompt_template {manifest_value!r} is not one of {sorted(TEMPLATES)}")
        return PromptTemplate(manifest_value, **TEMPLATES[manifest_value])
    if not isinstance(manifest_value, dict):
        raise ValueError(
            "srun.json prompt_template must be a name or an object {state, question, system?, answer_prefix?}"
        )
    unknown = set(manifest_value) - {"state", "question", "system", "answer_prefix"}
    if unknown or not {"state", "question"} <= set(manifest_value):
        raise ValueError(f"srun.json prompt_template needs `state` and `question` (unknown: {sorted(unknown)})")
    return PromptTemplate("manifest", **{k: str(v) for k, v in manifest_value.items()})


# ---------------------------------------------------------------------------------- questions
SingleToken = Callable[[str], "int | None"]  # the id of a text that is exactly one token, else None


def render_noul(instructions: Any, criteria: Mapping[str, Any] | None) -> RenderedQuestion:
    lines = [
        f"Question: {content_text(instructions)}"
        if instructions is not None
        else 'Question: Which of "Yes" and "No" applies?'
    ]
    for key, word in (("true", "Yes"), ("false", "No")):
        described = (criteria or {}).get(key)
        if described is not None:
            lines.append(f'"{word}" means: {content_text(described)}')
    lines.append("Answer with Yes or No.")
    if instructions is None and not any(v is not None for v in (criteria or {}).values()):
        raise QuestionError("invalid_question", "a noul question needs instructions or a described outcome")
    return RenderedQuestion("\n".join(lines), ("Yes", "No"), ("yes", "no"))


def option_keys(names: Sequence[str], single: SingleToken) -> tuple[str, ...]:
    """The criteria keys when each is one distinct token, else the first single-token OPTION_KEYS."""
    ids = [single(n) for n in names]
    if all(i is not None for i in ids) and len(set(ids)) == len(ids):
        return tuple(names)
    keys: list[str] = []
    seen: set[int] = set()
    for key in OPTION_KEYS:
        token = single(key)
        if token is not None and token not in seen:
            keys.append(key)
            seen.add(token)
            if len(keys) == len(names):
                return tuple(keys)
    raise QuestionError(
        "invalid_question",
        f"this model's tokenizer has single-token keys for only {len(keys)} options; the question has {len(names)}",
    )


def render_choice(instructions: Any, criteria: Mapping[str, Any], single: SingleToken) -> RenderedQuestion:
    names = list(criteria)
    if not MIN_OPTIONS <= len(names) <= MAX_OPTIONS:
        raise QuestionError(
            "invalid_question", f"a choice question takes {MIN_OPTIONS} to {MAX_OPTIONS} options (got {len(names)})"
        )
    keys = option_keys(names, single)
    by_name = keys == tuple(names)
    lines = [
        f"Question: {content_text(instructions) if instructions is not None else 'Which option fits best?'}",
        "Options:",
    ]
    for key, name in zip(keys, names):
        described = criteria[name]
        label = key if by_name else f"{key}. {name}"
        lines.append(f"{label}: {content_text(described)}" if described is not None else label)
    lines.append("Answer with one option name." if by_name else "Answer with the letter of one option.")
    return RenderedQuestion("\n".join(lines), keys, tuple(names))


def render_score(instructions: Any, criteria: Sequence[Any]) -> RenderedQuestion:
    if not MIN_LEVELS <= len(criteria) <= MAX_LEVELS:
        raise QuestionError(
            "invalid_question", f"a score question takes {MIN_LEVELS} to {MAX_LEVELS} levels (got {len(criteria)})"
        )
    levels = tuple(str(i) for i in range(len(criteria)))
    lines = [
        f"Question: {content_text(instructions) if instructions is not None else 'Which level fits best?'}",
        "Levels:",
    ]
    lines += [f"{level}: {content_text(c)}" for level, c in zip(levels, criteria)]
    lines.append("Answer with the number of one level.")
    return RenderedQuestion("\n".join(lines), levels, levels, dict(zip(levels, criteria)))


def render_question(kind: str, instructions: Any, criteria: Any, single: SingleToken) -> RenderedQuestion:
    if kind == "noul":
        return render_noul(instructions, criteria)
    if kind == "choice":
        return render_choice(instructions, criteria, single)
    if kind == "score":
        return render_score(instructions, criteria)
    raise QuestionError("invalid_question", f"this model does not answer {kind} questions")
