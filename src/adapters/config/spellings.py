"""Upstream's spellings beside ours, rewritten to the one canonical form before a config or a
models file is converted (R-ARG-2, issue 27):

| written | canonical |
|---|---|
| a deployment's or replica's `served_name` (an attached runtime's model) | `model` |
| a models file entry's `model` | `artifact` |
| `input: {max_tokens, overflow}` (deployment, models file entry) | `input_max_tokens`, `input_overflow` |
| a deployment without `artifact` whose replicas are all attached | `artifact`: the first replica's model |

Both spellings of one field may be written when they agree; when they disagree the line names
both. The dump (`loader.dump_config`) writes `input:` nested again (`nest_input`), as upstream does.
"""

from __future__ import annotations

from typing import Any

from vllm_srun.domain.settings import bounds

INPUT_FIELDS: dict[str, bounds.Setting[Any]] = {
    "max_tokens": bounds.INPUT_MAX_TOKENS,
    "overflow": bounds.INPUT_OVERFLOW,
}


def canonical_config(data: Any) -> tuple[Any, list[str]]:
    """A copy of a parsed front config in the canonical spellings, and one line per problem."""
    glob = data.get("global") if isinstance(data, dict) else None
    catalog = glob.get("model_catalog") if isinstance(glob, dict) else None
    deployments = catalog.get("deployments") if isinstance(catalog, dict) else None
    if not isinstance(deployments, dict):
        return data, []
    problems: list[str] = []
    rewritten = {
        name: _deployment(f"deployments.{name}", spec, problems) if isinstance(spec, dict) else spec
        for name, spec in deployments.items()
    }
    assert isinstance(data, dict) and isinstance(glob, dict) and isinstance(catalog, dict)
    catalog = {**catalog, "deployments": rewritten}
    return {**data, "global": {**glob, "model_catalog": catalog}}, problems


def canonical_models_file(data: Any) -> tuple[Any, list[str]]:
    """A copy of a parsed models file in the canonical spellings, and one line per problem."""
    models = data.get("models") if isinstance(data, dict) else None
    if not isinstance(models, list):
        return data, []
    problems: list[str] = []
    entries = []
    for index, entry in enumerate(models):
        if isinstance(entry, dict):
            entry = _input(
                f"models[{index}]", _renamed(f"models[{index}]", entry, "model", "artifact", problems), problems
            )
        entries.append(entry)
    assert isinstance(data, dict)
    return {**data, "models": entries}, problems


def nest_input(entry: dict[str, Any]) -> dict[str, Any]:
    """A canonical (dumped) entry with its input budget written as upstream's `input:` mapping."""
    flat = {f"input_{key}": key for key in INPUT_FIELDS}
    if not any(name in entry for name in flat):
        return entry
    out: dict[str, Any] = {}
    for key, value in entry.items():
        if key in flat:
            out.setdefault("input", {})[flat[key]] = value
        else:
            out[key] = value
    return out


def _deployment(path: str, spec: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    spec = _input(path, _renamed(path, spec, "served_name", "model", problems), problems)
    replicas = spec.get("replicas")
    if isinstance(replicas, list):
        replicas = [
            _renamed(f"{path}.replicas[{i}]", r, "served_name", "model", problems) if isinstance(r, dict) else r
            for i, r in enumerate(replicas)
        ]
        spec = {**spec, "replicas": replicas}
    if "artifact" not in spec:
        model = _attached_model(spec)
        if model is not None:
            spec = {"artifact": model, **spec}
    return spec


def _attached_model(spec: dict[str, Any]) -> Any:
    """The model of a deployment whose placements are all attached (endpoint), else None."""
    replicas = spec.get("replicas")
    if isinstance(replicas, list) and replicas:
        entries = [r for r in replicas if isinstance(r, dict)]
        if len(entries) == len(replicas) and all(r.get("endpoint") is not None for r in entries):
            return entries[0].get("model")
        return None
    if replicas is None and spec.get("endpoint") is not None:
        return spec.get("model")
    return None


def _renamed(path: str, entry: dict[str, Any], theirs: str, ours: str, problems: list[str]) -> dict[str, Any]:
    """ENTRY with upstream's key THEIRS written as OURS, in its place."""
    if theirs not in entry:
        return entry
    if ours in entry and entry[ours] != entry[theirs]:
        problems.append(
            f"{path}: '{theirs}' ({entry[theirs]}) and '{ours}' ({entry[ours]}) name one field and disagree; keep one"
        )
        return {key: value for key, value in entry.items() if key != theirs}
    out: dict[str, Any] = {}
    for key, value in entry.items():
        if key == theirs:
            out.setdefault(ours, value)
        elif key == ours:
            out[ours] = value
        else:
            out[key] = value
    return out


def _input(path: str, entry: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    """ENTRY with `input: {max_tokens, overflow}` written as the flat settings, in its place."""
    if "input" not in entry:
        return entry
    budget = entry["input"]
    flat: dict[str, Any] = {}
    if budget is not None and not isinstance(budget, dict):
        problems.append(f"{path}.input: expected a mapping with max_tokens and overflow, got {type(budget).__name__}")
        budget = {}
    for key, value in (budget or {}).items():
        setting = INPUT_FIELDS.get(key)
        if setting is None:
            problems.append(f"{path}.input.{key}: unknown field (expected max_tokens or overflow)")
        elif value is not None and not setting.accepts(value):
            problems.append(f"{path}.input.{key}: expected {_rule(setting)}, got {value!r}")
        elif value is not None:
            name = f"input_{key}"
            if entry.get(name) is not None and entry[name] != value:
                problems.append(f"{path}: 'input.{key}' ({value}) and '{name}' ({entry[name]}) disagree; keep one")
            else:
                flat[name] = value
    out: dict[str, Any] = {}
    for key, value in entry.items():
        if key == "input":
            out.update(flat)
        elif key not in flat:
            out[key] = value
    return out


def _rule(setting: bounds.Setting[Any]) -> str:
    rule = setting.rule()
    return f"an integer {rule}" if isinstance(setting, bounds.IntSetting) else rule
