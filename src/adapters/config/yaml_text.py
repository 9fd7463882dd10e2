"""YAML text of the canonical config in and out: a key given twice in one mapping is refused,
and every problem is one line with its position (R-ARG-2)."""

from __future__ import annotations

import typing
from typing import Any

import yaml

from .schema import ConfigError


class _StrictLoader(yaml.SafeLoader):
    """A SafeLoader that refuses a key given twice in one mapping."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if isinstance(key, typing.Hashable) and key in seen:
            raise ConfigError([f"line {key_node.start_mark.line + 1}: duplicate key {key!r}"])
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _construct_mapping,
)


def parse_yaml(text: str) -> Any:
    """Plain data (dicts, lists, scalars) of a YAML text; an empty text is an empty mapping."""
    try:
        data = yaml.load(text, Loader=_StrictLoader)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ConfigError([f"{where}invalid YAML: {error.problem}"]) from None
    except yaml.YAMLError as error:
        raise ConfigError([f"invalid YAML: {error}"]) from None
    return {} if data is None else data


def dump_yaml(data: Any) -> str:
    """YAML of plain data, keys in their order."""
    return yaml.safe_dump(data, sort_keys=False)
