"""Read and write the canonical config (YAML), reporting every problem at once (R-ARG-2).

`load_config_text` walks the parsed YAML against the Structs of `schema.py` and then applies
the rules that relate fields to each other. Each problem is one line, `PATH: what and why`,
where PATH starts at `deployments.NAME` for anything inside a deployment. Nothing is loaded
until there are no problems.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from pathlib import Path
from typing import Any

import msgspec
import yaml

from .rules import relation_problems
from .schema import (
    FIELD_HINTS,
    REMOVED_DEPLOYMENT_FIELDS,
    ConfigError,
    DeploymentConfig,
    FrontConfig,
    removed_value_hint,
)

CATALOG = "global.model_catalog.deployments"
TYPE_WORDS = {
    "`int`": "an integer",
    "`float`": "a number",
    "`str`": "a string",
    "`bool`": "true or false",
}
__all__ = [
    "ConfigError",
    "dump_config",
    "load_config_data",
    "load_config_file",
    "load_config_text",
    "parse_yaml",
    "validate_config_data",
]


# ---- YAML ----------------------------------------------------------------------------------
class _StrictLoader(yaml.SafeLoader):
    """A SafeLoader that refuses a key given twice in one mapping."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
        if isinstance(key, typing.Hashable) and key in seen:
            raise ConfigError([f"line {key_node.start_mark.line + 1}: duplicate key {key!r}"])
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _construct_mapping,  # type: ignore[arg-type]
)


def parse_yaml(text: str) -> Any:
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ConfigError([f"{where}invalid YAML: {error.problem}"]) from None
    except yaml.YAMLError as error:
        raise ConfigError([f"invalid YAML: {error}"]) from None
    return {} if data is None else data


# ---- loading -------------------------------------------------------------------------------
def load_config_text(text: str, *, source: str = "config.yaml") -> FrontConfig:
    return load_config_data(parse_yaml(text), source=source)


def load_config_file(path: str | Path) -> FrontConfig:
    return load_config_text(Path(path).read_text(encoding="utf-8"), source=str(path))


def load_config_data(data: Any, *, source: str = "config.yaml") -> FrontConfig:
    problems = validate_config_data(data, source=source)
    if problems:
        raise ConfigError(problems)
    try:
        return msgspec.convert(data, FrontConfig)
    except msgspec.ValidationError as error:  # a rule the walk missed; still one line
        raise ConfigError([f"config: {error}"]) from None


def validate_config_data(data: Any, *, source: str = "config.yaml") -> list[str]:
    """Every problem of a parsed config, one line each; [] when it loads."""
    problems: list[str] = []
    _walk_struct(data, FrontConfig, "", problems, source)
    if isinstance(data, dict):
        problems.extend(relation_problems(data))
    return problems


def dump_config(config: FrontConfig) -> str:
    """Canonical YAML of a config: fields left at their default (None) are not written."""
    return yaml.safe_dump(_drop_unset(msgspec.to_builtins(config)), sort_keys=False)


def _drop_unset(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _drop_unset(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [_drop_unset(item) for item in value]
    return value


# ---- the structural walk -------------------------------------------------------------------
def _display(path: str) -> str:
    if path.startswith(CATALOG + "."):
        return "deployments." + path[len(CATALOG) + 1 :]
    return path or "config"


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def _walk_struct(data: Any, struct: type, path: str, problems: list[str], source: str) -> None:
    if not isinstance(data, dict):
        problems.append(f"{_display(path)}: expected a mapping, got {_kind(data)}")
        return
    fields = {field.encode_name: field for field in msgspec.structs.fields(struct)}
    in_deployment = struct is DeploymentConfig
    for key, value in data.items():
        where = _join(path, key)
        field = fields.get(key) if isinstance(key, str) else None
        if field is None:
            if in_deployment and key in REMOVED_DEPLOYMENT_FIELDS:
                problems.append(
                    f"{_display(where)}: removed setting ({REMOVED_DEPLOYMENT_FIELDS[key]}); "
                    f"run `vllm-sr config migrate {source}` to rewrite the config"
                )
            else:
                problems.append(f"{_display(where)}: unknown field{_suggest(key, fields)}")
            continue
        _walk_value(value, field.type, where, key, problems, source)
    for name, field in fields.items():
        if field.required and name not in data:
            problems.append(f"{_display(path)}: missing required field '{name}'")


def _walk_value(
    value: Any, annotation: Any, path: str, name: str, problems: list[str], source: str
) -> None:
    inner = _strip_optional(annotation)
    if value is None and inner is not annotation:
        return
    target, bounds = _strip_annotated(inner)
    origin = typing.get_origin(target)
    if isinstance(target, type) and issubclass(target, msgspec.Struct):
        _walk_struct(value, target, path, problems, source)
    elif origin is list and _is_struct(typing.get_args(target)[0]):
        if not isinstance(value, list):
            problems.append(f"{_display(path)}: expected a list, got {_kind(value)}")
            return
        low = max((meta.min_length or 0 for meta in bounds), default=0)
        high = min((meta.max_length or len(value) for meta in bounds), default=len(value))
        if not low <= len(value) <= high:
            problems.append(
                f"{_display(path)}: expected between {low} and {high} entries, got {len(value)}"
            )
        for index, item in enumerate(value):
            _walk_struct(item, typing.get_args(target)[0], f"{path}[{index}]", problems, source)
    elif origin is dict and _is_struct(typing.get_args(target)[1]):
        if not isinstance(value, dict):
            problems.append(f"{_display(path)}: expected a mapping, got {_kind(value)}")
            return
        for key, item in value.items():
            _walk_struct(item, typing.get_args(target)[1], _join(path, key), problems, source)
    else:
        _check_leaf(value, annotation, path, name, problems, source)


def _check_leaf(
    value: Any, annotation: Any, path: str, name: str, problems: list[str], source: str
) -> None:
    hint = removed_value_hint(name, value)
    if hint is not None:
        problems.append(
            f"{_display(path)}: {hint}; run `vllm-sr config migrate {source}` to rewrite it"
        )
        return
    try:
        msgspec.convert(value, annotation)
    except msgspec.ValidationError as error:
        if name in FIELD_HINTS:
            expected = FIELD_HINTS[name]
        else:
            message = str(error).split(" - at ", 1)[0]
            expected = re.sub(r"^Expected ", "", message).split(", got ", 1)[0]
            expected = expected.replace(" | null", "")
            for spelled, words in TYPE_WORDS.items():
                expected = expected.replace(spelled, words)
        problems.append(f"{_display(path)}: expected {expected}, got {_show(value)}")


# ---- small helpers ---------------------------------------------------------------------------
def _strip_optional(annotation: Any) -> Any:
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and (type(None) in args):
        rest = [arg for arg in args if arg is not type(None)]
        return rest[0] if len(rest) == 1 else annotation
    return annotation


def _strip_annotated(annotation: Any) -> tuple[Any, list[msgspec.Meta]]:
    if typing.get_origin(annotation) is typing.Annotated:
        target, *extras = typing.get_args(annotation)
        return target, [extra for extra in extras if isinstance(extra, msgspec.Meta)]
    return annotation, []


def _is_struct(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, msgspec.Struct)


def _suggest(key: Any, fields: dict[str, Any]) -> str:
    close = difflib.get_close_matches(str(key), list(fields), n=1, cutoff=0.75)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _kind(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", type(None): "null"}.get(
        type(value), _show(value)
    )


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
