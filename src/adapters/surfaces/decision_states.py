"""What text of a state a decision question reads (R-API-4): the whole state, its typed parts, or
the fields its `over` names (R-DEC-3). The family writes that text into its prompt template as it is, so
a span's offsets count code points of exactly this text.

- A string is read as it is; an array, and an object without typed parts, as JSON (unchanged).
- **Typed parts**: an object with a `request`, `user` or `prompt` field (the user part) or an
  `answer` or `response` field (the answer part; keys matched case-insensitively) is written as
  labelled sections in reading order — `Context:` (every other field, `key: value` per line),
  `Request:`, `Response:` — each section holding its field's value (`key: value` lines when a
  part has several fields). A span question without `over` reads the answer part's field when
  there is one, else the user part's.
- **over** (a field name, or a list of names) reads only those fields of an object state, in
  the state's order: one field is its value (text as it is, anything else as JSON); several are
  the object of those fields, written as a state. A state that is not an object, or a name it
  does not hold, fails the question with `invalid_question`.
- **require_full_input** needs the question to read the whole state: with an `over` (or a span's
  default field) that leaves fields out it fails with `invalid_question` — these models read
  nothing outside what the question reads, so they cannot vouch for it.
"""

from __future__ import annotations

from typing import Any

from vllm_srun.adapters.contracts import QuestionError
from vllm_srun.adapters.contracts.decisions import content_text
from vllm_srun.adapters.surfaces.decision_questions import INVALID, ReadQuestion

USER_KEYS = frozenset({"request", "user", "prompt"})
ANSWER_KEYS = frozenset({"answer", "response"})
SECTIONS = (("context", "Context"), ("user", "Request"), ("answer", "Response"))


def _role(key: str) -> str:
    low = key.lower()
    return "user" if low in USER_KEYS else "answer" if low in ANSWER_KEYS else "context"


def has_typed_parts(state: Any) -> bool:
    return isinstance(state, dict) and any(_role(key) != "context" for key in state)


def state_text(state: Any) -> str:
    """STATE as the model reads it when a question reads all of it."""
    if not has_typed_parts(state):
        return content_text(state)
    parts: dict[str, list[tuple[str, str]]] = {role: [] for role, _ in SECTIONS}
    for key, value in state.items():
        parts[_role(key)].append((key, content_text(value)))
    blocks = []
    for role, heading in SECTIONS:
        items = parts[role]
        if not items:
            continue
        if len(items) == 1 and role != "context":
            body = items[0][1]
        else:
            body = "\n".join(f"{key}: {text}" for key, text in items)
        blocks.append(f"{heading}:\n{body}")
    return "\n\n".join(blocks)


def _span_field(state: dict[str, Any]) -> str:
    """A span's default field on a typed state: the answer part's, else the user part's."""
    for role in ("answer", "user"):
        for key in state:
            if _role(key) == role:
                return key
    raise AssertionError("a typed state has a user or an answer field")


def _what(state: Any) -> str:
    return "text" if isinstance(state, str) else "an array" if isinstance(state, list) else "not an object"


def view_text(q: ReadQuestion, state: Any) -> str:
    """The text question Q reads of STATE; raises QuestionError (invalid_question)."""
    over = q.over
    if over is None and q.kind == "span" and has_typed_parts(state):
        over = (_span_field(state),)
        if q.require_full_input and len(state) > 1:
            raise QuestionError(
                INVALID,
                f"require_full_input needs the whole state read, and a span question reads one field ({over[0][:64]!r}): "
                "this model reads nothing outside it",
            )
    if over is None:
        return state_text(state)
    if not isinstance(state, dict):
        raise QuestionError(INVALID, f"over reads fields of an object state; this state is {_what(state)}")
    missing = [name for name in over if name not in state]
    if missing:
        raise QuestionError(INVALID, f"over names {missing[0][:64]!r}, which is not a field of the state")
    if q.require_full_input and len(over) < len(state):
        left = sorted(key for key in state if key not in over)
        raise QuestionError(
            INVALID,
            f"require_full_input needs the whole state read, and over leaves out {[k[:64] for k in left[:8]]}: "
            "this model reads nothing outside over",
        )
    if len(over) == 1:
        return content_text(state[over[0]])
    return state_text({key: value for key, value in state.items() if key in over})
