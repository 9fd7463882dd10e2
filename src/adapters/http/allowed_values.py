"""What a refused enum field would have taken: msgspec says "Invalid enum value 'max' - at
`$.options.aggregation`" and stops there; the 400's message adds the values the request Struct
allows at that path ("(one of: first, none, simple)"), read from the Struct's own type, so it
never drifts from what the decoder accepts."""

from __future__ import annotations

import re
from typing import Any

from msgspec import inspect

_ENUM_ERROR = re.compile(r"^Invalid enum value .* - at `(?P<path>\$[^`]*)`$")
_STEP = re.compile(r"\.(?P<field>[A-Za-z_][A-Za-z0-9_]*)|\[(?P<index>\d+)\]|\[(?P<key>\.\.\.|'[^']*'|\"[^\"]*\")\]")


def with_allowed_values(message: str, root: Any) -> str:
    """MESSAGE (msgspec's first line) with the allowed values appended when it refused an enum
    value of ROOT (the decoded type); else MESSAGE unchanged."""
    match = _ENUM_ERROR.match(message)
    if match is None:
        return message
    try:
        values = _allowed(inspect.type_info(root), _steps(match["path"][1:]))
    except (TypeError, ValueError):
        return message
    if not values:
        return message
    return f"{message} (one of: {', '.join(values)})"


def _steps(path: str) -> list[str | int | None]:
    """`.options.aggregation` → ["options", "aggregation"]; `[0]` → 0; a key (`[...]`) → None."""
    steps: list[str | int | None] = []
    at = 0
    while at < len(path):
        step = _STEP.match(path, at)
        if step is None:
            raise ValueError(path)
        if step["field"] is not None:
            steps.append(step["field"])
        elif step["index"] is not None:
            steps.append(int(step["index"]))
        else:
            steps.append(None)
        at = step.end()
    return steps


def _allowed(info: inspect.Type, steps: list[str | int | None]) -> list[str]:
    """The values of the enum or literal at STEPS below INFO (every branch of a union tried)."""
    while isinstance(info, inspect.Metadata):  # Annotated[..., Meta(...)]
        info = info.type
    if isinstance(info, inspect.UnionType):
        found: list[str] = []
        for member in info.types:
            for value in _allowed(member, steps):
                if value not in found:
                    found.append(value)
        return found
    if not steps:
        if isinstance(info, inspect.LiteralType):
            return [str(v) for v in info.values]
        if isinstance(info, inspect.EnumType):
            return [str(member.value) for member in info.cls]
        return []
    step, rest = steps[0], steps[1:]
    if isinstance(info, inspect.StructType) and isinstance(step, str):
        for field in info.fields:
            if field.encode_name == step:
                return _allowed(field.type, rest)
        return []
    if isinstance(info, inspect.ListType | inspect.SetType | inspect.VarTupleType) and isinstance(step, int):
        return _allowed(info.item_type, rest)
    if isinstance(info, inspect.DictType):
        return _allowed(info.value_type, rest)
    return []
