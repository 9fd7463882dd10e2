"""Load the canonical config, reporting every problem at once (R-ARG-2).

The parsed YAML is converted to the Structs of `schema.py` with msgspec, which stops at the
first problem: the problem becomes one line, what it is about is pruned from a copy of the
data, and the copy is converted again until it converts. msgspec reads in order, so the lines
follow the file. Then the rules that relate fields to each other (`rules.py`) run on the data
as written, with the engine registry (a deployment's `engine` must be installed; default: this
process's installed plugins). Each line is `PATH: what and why`, PATH starting at
`deployments.NAME` for anything inside a deployment. Nothing is loaded until there are no problems.
"""

from __future__ import annotations

import copy
import difflib
import re
from pathlib import Path
from typing import Any

import msgspec
from msgspec.inspect import DictType, ListType, NoneType, StructType, UnionType, type_info

from vllm_srun.adapters.engines.registry import EngineRegistry, installed_engines

from .rules import relation_problems
from .schema import (
    FIELD_HINTS,
    REMOVED_DEPLOYMENT_FIELDS,
    ConfigError,
    DeploymentConfig,
    FrontConfig,
    removed_value_hint,
)
from .spellings import canonical_config, nest_input
from .yaml_text import dump_yaml, parse_yaml

CATALOG = "global.model_catalog.deployments"
TYPE_WORDS = {
    "`int`": "an integer",
    "`float`": "a number",
    "`str`": "a string",
    "`bool`": "true or false",
    "`object`": "a mapping",
    "`array`": "a list",
}
# msgspec's `MESSAGE - at `$.a.b[0]`` (or `at `key` in …` for a mapping key); `[...]` is an
# entry of a mapping, which msgspec does not name
ERROR = re.compile(r"(.*?)(?: - at (`key` in )?`\$(.*)`)?", flags=re.DOTALL)
STEP = re.compile(r"\.([^.\[]+)|\[(\d+|\.\.\.)\]")
FIELD = re.compile(r"Object (contains unknown|missing required) field `(.*)`")
__all__ = [
    "ConfigError",
    "conversion_problems",
    "dump_config",
    "load_config_data",
    "load_config_file",
    "load_config_text",
    "validate_config_data",
]


def load_config_text(text: str, *, source: str = "config.yaml", engines: EngineRegistry | None = None) -> FrontConfig:
    return load_config_data(parse_yaml(text), source=source, engines=engines)


def load_config_file(path: str | Path, engines: EngineRegistry | None = None) -> FrontConfig:
    return load_config_text(Path(path).read_text(encoding="utf-8"), source=str(path), engines=engines)


def load_config_data(data: Any, *, source: str = "config.yaml", engines: EngineRegistry | None = None) -> FrontConfig:
    problems = validate_config_data(data, source=source, engines=engines)
    if problems:
        raise ConfigError(problems)
    try:
        return msgspec.convert(canonical_config(data)[0], FrontConfig)
    except msgspec.ValidationError as error:  # pruned without a line of its own; still one line
        raise ConfigError([f"config: {error}"]) from None


def validate_config_data(data: Any, *, source: str = "config.yaml", engines: EngineRegistry | None = None) -> list[str]:
    """Every problem of a parsed config, one line each; [] when it loads. ENGINES: the engine
    plugins a deployment's `engine` may name (default: the installed ones). Upstream's spellings
    are read as ours first (`spellings.py`)."""
    data, problems = canonical_config(data)
    return (
        problems
        + conversion_problems(data, FrontConfig, source=source)
        + (relation_problems(data, engines or installed_engines()) if isinstance(data, dict) else [])
    )


def conversion_problems(data: Any, target: type, *, source: str) -> list[str]:
    """Every problem converting parsed YAML to the Struct TARGET, one line each, in file order."""
    pruning = _Pruning(data, source, target)
    while (error := _failure(pruning.work, target)) and pruning.prune(error):
        pass
    return pruning.problems


def dump_config(config: FrontConfig) -> str:
    """Canonical YAML of a config: fields left at their default (None) are not written; the input
    budget as upstream's `input: {max_tokens, overflow}`."""
    data = _drop_unset(msgspec.to_builtins(config))
    catalog = data.get("global", {}).get("model_catalog", {})
    for holder in (data, catalog):  # a decision model written in neither place is not written
        if holder.get("system") == {"decision_model": {}}:
            del holder["system"]
    deployments = catalog.get("deployments", {})
    for name, deployment in deployments.items():
        deployments[name] = nest_input(deployment)
    return dump_yaml(data)


def _drop_unset(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _drop_unset(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [_drop_unset(item) for item in value]
    return value


class _Pruning:
    """A copy of the data from which what each problem is about is pruned, one line each."""

    def __init__(self, data: Any, source: str, root: type) -> None:
        self.work, self.source, self.root = copy.deepcopy(data), source, root
        self.problems: list[str] = []
        self.refused: set[tuple[Any, ...]] = set()  # fields whose value was refused (and pruned)
        self.dropped: dict[tuple[Any, ...], list[int]] = {}  # list (as written) → pruned indices

    def prune(self, error: str) -> bool:
        """Report msgspec's `error` in one line and prune it; False when nothing is left."""
        # ERROR matches any text (its location part is optional), so there is always a match
        match = ERROR.fullmatch(error)
        if match is None:
            raise AssertionError(f"msgspec error {error!r} does not fit the ERROR pattern")
        message, about_key, where = match.groups()
        path: list[Any] = []  # into the pruned copy
        written: list[Any] = []  # the same place in the data as written
        for name, index in STEP.findall(where or ""):
            if index == "...":  # the first entry that fails alone (msgspec reads in order);
                entries = _node_at(self.root, written).value_type.cls  # the config's mappings hold sections
                name = next(k for k, v in _get(self.work, path).items() if _failure(v, entries))
            step = int(index) if index.isdigit() else name
            written.append(_as_written(step, self.dropped.get(tuple(written), [])))
            path.append(step)
        field = FIELD.fullmatch(message)
        if about_key:  # a key that is not a string; a deployment's name is left to rules.py
            key = next(key for key in _get(self.work, path) if not isinstance(key, str))
            if isinstance(_node_at(self.root, written), StructType):
                self.problems.append(f"{_display([*written, str(key)])}: unknown field")
            path.append(key)
        elif field and field[1] == "contains unknown":
            self.problems.append(self._unknown(written, field[2]))
            path.append(field[2])
        elif field:  # said after everything inside the object, which may all go
            if (*written, field[2]) not in self.refused:  # else its refused value was said
                self.problems.append(f"{_display(written)}: missing required field '{field[2]}'")
        else:
            self.problems.append(self._bad_value(message, written, _get(self.work, path)))
            self.refused.add(tuple(written))
        if path and isinstance(_get(self.work, path[:-1]), list):
            self.dropped.setdefault(tuple(written[:-1]), []).append(written[-1])
        if path:
            del _get(self.work, path[:-1])[path[-1]]
        return bool(path)

    def _unknown(self, written: list[Any], key: str) -> str:
        where, node = _display([*written, key]), _node_at(self.root, written)
        if node.cls is DeploymentConfig and key in REMOVED_DEPLOYMENT_FIELDS:
            return (
                f"{where}: removed setting ({REMOVED_DEPLOYMENT_FIELDS[key]}); "
                f"run `vllm-sr config migrate {self.source}` to rewrite the config"
            )
        close = difflib.get_close_matches(key, [f.encode_name for f in node.fields], 1, 0.75)
        return f"{where}: unknown field" + (f" (did you mean '{close[0]}'?)" if close else "")

    def _bad_value(self, message: str, written: list[Any], value: Any) -> str:
        where, node = _display(written), _node_at(self.root, written)
        field = written[-1] if written and isinstance(written[-1], str) else ""
        removed = removed_value_hint(field, value)
        if removed is not None:
            return f"{where}: {removed}; run `vllm-sr config migrate {self.source}` to rewrite it"
        if isinstance(node, ListType) and isinstance(value, list) and "of length" in message:
            low, high = node.min_length or 0, node.max_length
            wanted = f"between {low} and {high} entries" if high is not None else f"at least {low} entr"
            if high is None:
                wanted += "y" if low == 1 else "ies"
            return f"{where}: expected {wanted}, got {len(value)}"
        expected = FIELD_HINTS.get(field)
        if expected is None:  # msgspec's `Expected `int` >= 1, got `str``, in words
            expected = re.sub(r"^Expected |, got `\w+`$| \| null", "", message)
            for spelled, words in TYPE_WORDS.items():
                expected = expected.replace(spelled, words)
        return f"{where}: expected {expected}, got {_show(value)}"


def _failure(data: Any, target: type) -> str | None:
    """msgspec's message for the first problem converting `data`, or None when it converts."""
    try:
        msgspec.convert(data, target)
    except msgspec.ValidationError as error:
        return str(error)
    return None


def _node_at(root: type, path: list[Any]) -> Any:
    """The msgspec type at a path into a ROOT document; a union with None is its other member."""
    node: Any = type_info(root)
    for step in path:
        if isinstance(node, StructType):
            node = next(field.type for field in node.fields if field.encode_name == step)
        elif isinstance(node, (ListType, DictType)):
            node = node.item_type if isinstance(node, ListType) else node.value_type
        if isinstance(node, UnionType):
            node = next(member for member in node.types if not isinstance(member, NoneType))
    return node


def _get(data: Any, path: list[Any]) -> Any:
    for step in path:
        data = data[step]
    return data


def _as_written(step: Any, dropped: list[int]) -> Any:
    """A list index into the pruned copy as an index into the list as written."""
    if isinstance(step, int):
        for gone in sorted(dropped):
            if gone <= step:
                step += 1
    return step


def _display(path: list[Any]) -> str:
    text = "".join(f"[{step}]" if isinstance(step, int) else f".{step}" for step in path)[1:]
    if text.startswith(CATALOG + "."):
        return "deployments." + text[len(CATALOG) + 1 :]
    return text or "config"


def _show(value: Any) -> str:
    if isinstance(value, (dict, list)) or value is None:
        kinds: dict[type[Any], str] = {dict: "a mapping", list: "a list"}
        return kinds.get(type(value), "null")
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
