"""Reading one decision question in its slot (R-API-5): a JSON value in, a `ReadQuestion` or a
`QuestionError` out, before anything is tokenized (R-DEC-4: the fields our models have no use for).

Every check here fails the question alone with `invalid_question` and a message naming the
field; the request's other questions are answered. In order:

1. the question is an object; a `preset` is refused (these models define none); a field sent
   as null counts as left out (but `require_full_input` must be a boolean);
2. `type` is one of noul, choice, score, set, span (`box` needs an image model);
3. it holds only its type's fields (`set questions do not take ['colour']`);
4. each field has its JSON type (`QuestionSpec`), then the rules of its type: `criteria` or its
   ordered form (`choices` for choice and noul, `levels` for score, `labels` for set and span),
   never both; 2–255 options, 2–10 levels, 1–255 labels, each key once; non-blank text;
   `threshold` in [0, 1]; `head: broad` needs a broad span head (ours have none);
   `overflow: window` needs a scan budget (ours have none); `require_full_input` is a boolean and
   never goes with `overflow: truncate`.

`over` is read here (a field name or a list of them) and resolved against each state later
(`decision_states.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from vllm_srun.adapters.contracts import QuestionError
from vllm_srun.adapters.schemas.decisions import MAX_LABELS, MIN_LABELS, ChoiceOption, QuestionSpec

MIN_OPTIONS, MAX_OPTIONS = 2, 255
MIN_LEVELS, MAX_LEVELS = 2, 10
TYPES = ("choice", "noul", "score", "set", "span")
DEFAULT_THRESHOLD = 0.5  # set and span: the models of this family have no calibrated threshold
INVALID = "invalid_question"

_ANY_TYPE = frozenset({"type", "instructions", "criteria", "over", "require_full_input", "overflow", "preset"})
FIELDS: dict[str, frozenset[str]] = {
    "choice": _ANY_TYPE | {"choices"},
    "noul": _ANY_TYPE | {"choices"},
    "score": _ANY_TYPE | {"levels"},
    "set": _ANY_TYPE | {"labels", "threshold"},
    "span": _ANY_TYPE | {"labels", "threshold", "head"},
}
ORDERED_FORM = {"choice": "choices", "noul": "choices", "score": "levels", "set": "labels", "span": "labels"}


@dataclass(frozen=True, slots=True)
class Label:
    key: str
    description: Any = None


@dataclass(frozen=True)
class ReadQuestion:
    """A valid question: its type, instructions and options in order, and how it reads the state."""

    name: str
    kind: str
    instructions: Any
    criteria: Any = None  # noul: {true, false}; choice: option → description; score: the levels
    labels: tuple[Label, ...] = ()  # set, span
    threshold: float = DEFAULT_THRESHOLD  # set, span
    over: tuple[str, ...] | None = None  # the state fields it reads (None: the whole state)
    require_full_input: bool = False
    overflow: str | None = None  # "truncate", or None: the deployment's input.overflow


def sent_type(question: Any) -> str | None:
    """The `type` a question was sent with, echoed in its slot when it fails (None: none sent)."""
    kind = question.get("type") if isinstance(question, Mapping) else None
    return kind if isinstance(kind, str) else None


def _invalid(message: str) -> QuestionError:
    return QuestionError(INVALID, message[:300])  # a message echoes what was sent: held short


def read_question(name: str, question: Any) -> ReadQuestion:
    """QUESTION (as sent) read and checked; raises QuestionError (invalid_question)."""
    if not isinstance(question, dict):
        raise _invalid("a question must be an object")
    if question.get("preset") is not None:
        raise _invalid("this model defines no presets (its card lists none); write the question out")
    kind = question.get("type")
    if kind == "box":
        raise _invalid("box questions locate things in an image; this model reads text only")
    if kind not in TYPES:
        shown = repr(kind) if isinstance(kind, str) else "missing" if kind is None else "not a string"
        raise _invalid(f"type must be one of {', '.join(TYPES)} (it is {shown[:80]})")
    unknown = set(question) - FIELDS[kind]
    if unknown:
        raise _invalid(f"{kind} questions do not take {sorted(str(u)[:64] for u in unknown)[:8]}")
    # a field sent as null is a field left out; require_full_input is a boolean, never coerced
    given = {k: v for k, v in question.items() if v is not None or k == "require_full_input"}
    try:
        spec = msgspec.convert(given, QuestionSpec)
    except msgspec.ValidationError as exc:
        raise _invalid(_where(str(exc))) from None
    return _checked(name, kind, spec)


def _where(message: str) -> str:
    """msgspec's `Expected X - at $.field[0]` as `field[0]: expected X`."""
    text, _, at = message.partition(" - at `$")
    field = at.rstrip("`").lstrip(".")
    text = text[:1].lower() + text[1:]
    return f"{field}: {text}"[:300] if field else text[:300]


def _text(value: Any, where: str, *, nullable: bool = False) -> Any:
    """Non-blank text, an object or an array (null where NULLABLE)."""
    if value is None:
        if nullable:
            return None
        raise _invalid(f"{where} must be text, an object or an array")
    if isinstance(value, str):
        if not value.strip():
            raise _invalid(f"{where} must not be blank")
        return value
    if isinstance(value, (dict, list)):
        return value
    raise _invalid(f"{where} must be text, an object or an array")


def _one_form(spec: QuestionSpec, kind: str) -> tuple[str, Any]:
    """The field that carries the options (`criteria` or the type's ordered form) and its value."""
    ordered = ORDERED_FORM[kind]
    listed = getattr(spec, ordered)
    if listed is not None and spec.criteria is not None:
        raise _invalid(f"a {kind} question takes criteria or {ordered}, not both")
    return (ordered, listed) if listed is not None else ("criteria", spec.criteria)


def _keyed(field: str, items: list[Any], allowed: tuple[str, ...] | None = None) -> dict[str, Any]:
    """An ordered `[{key, description}]` (or bare names, for labels) as {key: description}."""
    out: dict[str, Any] = {}
    for i, item in enumerate(items):
        key, description = (item.key, item.description) if isinstance(item, ChoiceOption) else (item, None)
        if not key.strip():
            raise _invalid(f"{field}[{i}].key must not be blank")
        if key in out:
            raise _invalid(f"{field}: the key {key[:64]!r} appears more than once")
        if allowed is not None and key not in allowed:
            raise _invalid(f"{field}[{i}].key must be one of {', '.join(allowed)}")
        out[key] = _text(description, f"{field}[{i}].description", nullable=True)
    return out


def _described(field: str, criteria: Any) -> dict[str, Any]:
    """A `{key: description|null}` criteria object, keys non-blank."""
    if not isinstance(criteria, dict):
        raise _invalid(f"{field} must be an object of option → description")
    for key in criteria:
        if not key.strip():
            raise _invalid(f"{field}: an option name must not be blank")
    return {key: _text(value, f"{field}.{key[:64]}", nullable=True) for key, value in criteria.items()}


def _count(field: str, n: int, low: int, high: int, what: str) -> None:
    if not low <= n <= high:
        raise _invalid(f"{field} must hold {low} to {high} {what} (it holds {n})")


def _options(kind: str, spec: QuestionSpec) -> tuple[Any, tuple[Label, ...]]:
    field, value = _one_form(spec, kind)
    if kind == "score":
        if value is None:
            raise _invalid("a score question needs criteria or levels (an ordered list of level descriptions)")
        if not isinstance(value, list):
            raise _invalid(f"{field} must be an ordered list of level descriptions")
        _count(field, len(value), MIN_LEVELS, MAX_LEVELS, "levels")
        return [_text(level, f"{field}[{i}]") for i, level in enumerate(value)], ()
    if kind == "noul":
        if value is None:
            return None, ()
        given = _keyed(field, value, ("false", "true")) if field == "choices" else None
        if given is None:
            if not isinstance(value, dict) or set(value) - {"true", "false"}:
                raise _invalid("noul criteria may hold only true and false")
            given = {k: _text(v, f"criteria.{k}", nullable=True) for k, v in value.items()}
        return {"true": given.get("true"), "false": given.get("false")}, ()
    if kind == "choice":
        if value is None:
            raise _invalid("a choice question needs criteria or choices")
        options = _keyed(field, value) if field == "choices" else _described(field, value)
        _count(field, len(options), MIN_OPTIONS, MAX_OPTIONS, "options")
        return options, ()
    # set, span
    if value is None:
        raise _invalid(f"a {kind} question needs labels or criteria")
    labels = _keyed(field, value) if field == "labels" else _described(field, value)
    _count(field, len(labels), MIN_LABELS, MAX_LABELS, "labels")
    if field == "criteria" and any(len(key) > 256 for key in labels):
        raise _invalid("criteria: a label is at most 256 characters")
    return None, tuple(Label(key, description) for key, description in labels.items())


def _over(value: str | list[str] | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    names = [value] if isinstance(value, str) else value
    if not names:
        raise _invalid("over must name at least one field of the state")
    if len(set(names)) != len(names):
        raise _invalid("over names a field more than once")
    return tuple(names)


def _checked(name: str, kind: str, spec: QuestionSpec) -> ReadQuestion:
    instructions = _text(spec.instructions, "instructions", nullable=True)
    criteria, labels = _options(kind, spec)
    if spec.threshold is not None and not 0.0 <= spec.threshold <= 1.0:
        raise _invalid(f"threshold must be in [0, 1] (it is {spec.threshold:g})")
    if spec.head == "broad":
        raise _invalid("this model has no broad span head (head may be router, or left out)")
    if spec.overflow == "window":
        raise _invalid(
            "overflow window needs a model with a scan budget (card limits.max_scan_tokens); this model "
            "reads one bounded input: leave overflow out, or use truncate"
        )
    if spec.require_full_input and spec.overflow == "truncate":
        raise _invalid("require_full_input cannot go with overflow truncate")
    over = _over(spec.over)
    if kind == "span" and over is not None and len(over) > 1:
        raise _invalid("a span question reads one field (over names several)")
    return ReadQuestion(
        name,
        kind,
        instructions,
        criteria,
        labels,
        DEFAULT_THRESHOLD if spec.threshold is None else float(spec.threshold),
        over,
        spec.require_full_input,
        spec.overflow,
    )


def read_all(questions: Mapping[str, Any]) -> dict[str, ReadQuestion | QuestionError]:
    """Every question of one request (or `states` entry) read in its slot, in order."""
    out: dict[str, ReadQuestion | QuestionError] = {}
    for name, question in questions.items():
        try:
            out[name] = read_question(name, question)
        except QuestionError as exc:
            out[name] = exc
    return out
