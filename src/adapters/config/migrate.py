"""`vllm-sr config migrate FILE`: rewrite removed settings into the canonical config (R-ARG-1).

| removed | becomes |
|---|---|
| `precision: fp32 / bf16 / fp16` | `dtype: float32 / bfloat16 / float16` |
| `batch_size`, `max_batch_size` | `max_num_seqs` |
| `use_cpu: true` | `device: cpu` (`use_cpu: false` is dropped) |
| `profile`, `custom_ops_profile`, `compilation_cache_dir` | dropped |
| `provider: candle / ort / openvino` | `model_runtime` (`ort` adds `engine: onnxruntime`) |
| `device: migraphx:N` (deployment or replica) | `device: rocm:N` |

A rewrite that would change what the config means (two settings that disagree, a precision
with no dtype) is refused with one line per problem instead. Keys keep their order; YAML
comments are not kept (pyyaml drops them), which the change list says.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from .loader import CATALOG
from .schema import REMOVED_DEVICE_PREFIX, REMOVED_PROVIDERS, ConfigError
from .yaml_text import parse_yaml

PRECISION_TO_DTYPE = {
    "auto": "auto",
    "fp32": "float32",
    "float32": "float32",
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
    "half": "float16",
}
DROPPED = {
    "profile": "faster kernels are chosen per model from its records",
    "custom_ops_profile": "faster kernels are chosen per model from its records",
    "compilation_cache_dir": "no longer used",
}


class MigrationError(ConfigError):
    """The config names removed settings that cannot be rewritten without changing it."""


@dataclass(frozen=True)
class Migration:
    text: str  # the migrated YAML (the input, untouched, when nothing changed)
    changes: tuple[str, ...]  # one line per rewrite, `PATH: old → new`

    @property
    def changed(self) -> bool:
        return bool(self.changes)


def migrate_config_text(text: str) -> Migration:
    data = parse_yaml(text)
    migrated, changes = migrate_config_data(data)
    if not changes:
        return Migration(text, ())
    if "#" in text:
        changes.append("note: comments of the original file are not kept")
    return Migration(yaml.safe_dump(migrated, sort_keys=False, allow_unicode=True), tuple(changes))


def migrate_config_data(data: Any) -> tuple[Any, list[str]]:
    """The migrated copy of a parsed config and what changed; raises MigrationError."""
    glob = data.get("global") if isinstance(data, dict) else None
    catalog = glob.get("model_catalog") if isinstance(glob, dict) else None
    deployments = catalog.get("deployments") if isinstance(catalog, dict) else None
    if not isinstance(deployments, dict):
        return data, []
    changes: list[str] = []
    problems: list[str] = []
    rewritten = {
        name: _migrate_deployment(f"deployments.{name}", spec, changes, problems) if isinstance(spec, dict) else spec
        for name, spec in deployments.items()
    }
    if problems:
        raise MigrationError(problems)
    if not changes:
        return data, []
    path = CATALOG.split(".")
    return _with(data, path, rewritten), changes


def _with(data: dict[str, Any], path: list[str], value: Any) -> dict[str, Any]:
    """A copy of `data` with the mapping at `path` replaced (other keys in their order)."""
    head, *rest = path
    return {key: (_with(item, rest, value) if rest else value) if key == head else item for key, item in data.items()}


def _migrate_deployment(path: str, spec: dict[str, Any], changes: list[str], problems: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}

    def put(key: str, value: Any, because: str) -> None:
        """Write a rewritten key, refusing one that disagrees with what is already there."""
        explicit = spec.get(key, out.get(key))
        if explicit is not None and explicit != value:
            problems.append(f"{path}.{because}: rewrites to {key}: {value} but {key} is {explicit}; keep one of them")
            return
        out.setdefault(key, value)

    for key, value in spec.items():
        if key == "precision":
            dtype = PRECISION_TO_DTYPE.get(value.lower()) if isinstance(value, str) else None
            if dtype is None:
                problems.append(
                    f"{path}.precision: {value!r} has no dtype; set dtype to one of "
                    "auto, float32, bfloat16, float16 and remove precision"
                )
                continue
            put("dtype", dtype, key)
            changes.append(f"{path}.precision: {value} → dtype: {dtype}")
        elif key in ("batch_size", "max_batch_size"):
            put("max_num_seqs", value, key)
            changes.append(f"{path}.{key}: {value} → max_num_seqs: {value}")
        elif key == "use_cpu":
            _migrate_use_cpu(path, spec, value, out, changes, problems)
        elif key in DROPPED:
            changes.append(f"{path}.{key}: removed ({DROPPED[key]})")
        elif key == "provider" and isinstance(value, str) and value in REMOVED_PROVIDERS:
            out[key] = "model_runtime"
            engine = REMOVED_PROVIDERS[value]
            changes.append(f"{path}.provider: {value} → model_runtime")
            if engine is not None:
                put("engine", engine, "provider")
                changes.append(f"{path}.provider: {value} → engine: {engine}")
        elif key == "device":
            out.setdefault(key, _migrate_device(f"{path}.device", value, changes, problems))
        elif key == "replicas" and isinstance(value, list):
            out[key] = [
                _migrate_replica(f"{path}.replicas[{index}]", replica, changes, problems)
                for index, replica in enumerate(value)
            ]
        elif key not in out:
            out[key] = value
    return out


def _migrate_use_cpu(
    path: str,
    spec: dict[str, Any],
    value: Any,
    out: dict[str, Any],
    changes: list[str],
    problems: list[str],
) -> None:
    if value is False:
        changes.append(f"{path}.use_cpu: false → removed (placement is 'device')")
        return
    if value is not True:
        problems.append(f"{path}.use_cpu: expected true or false, got {value!r}")
        return
    if "replicas" in spec:
        devices = [r.get("device") for r in spec["replicas"] or [] if isinstance(r, dict)]
        if any(device not in ("cpu", None) for device in devices):
            problems.append(
                f"{path}.use_cpu: true contradicts replicas placed on "
                f"{', '.join(map(str, devices))}; set each replica's device and remove use_cpu"
            )
            return
        changes.append(f"{path}.use_cpu: true → removed (the replicas are on the CPU)")
        return
    device = spec.get("device")
    if device not in (None, "auto", "cpu"):
        problems.append(f"{path}.use_cpu: true contradicts device: {device}; keep one of them")
        return
    out["device"] = "cpu"
    changes.append(f"{path}.use_cpu: true → device: cpu")


def _migrate_device(path: str, value: Any, changes: list[str], problems: list[str]) -> Any:
    if not (isinstance(value, str) and value.startswith(REMOVED_DEVICE_PREFIX)):
        return value
    index = value[len(REMOVED_DEVICE_PREFIX) :]
    if not index.isdigit():
        problems.append(f"{path}: cannot rewrite {value!r}; expected migraphx:N")
        return value
    changes.append(f"{path}: {value} → rocm:{index}")
    return f"rocm:{index}"


def _migrate_replica(path: str, replica: Any, changes: list[str], problems: list[str]) -> Any:
    if not isinstance(replica, dict) or "device" not in replica:
        return replica
    device = _migrate_device(f"{path}.device", replica["device"], changes, problems)
    return {key: device if key == "device" else item for key, item in replica.items()}
