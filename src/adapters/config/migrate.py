"""`vllm-sr config migrate FILE`: rewrite settings of older releases into the canonical config
(R-ARG-1), among them every deployment the released vllm-sr 0.4.0 schema accepts.

| older | becomes |
|---|---|
| `precision: native / fp32` | `dtype: auto / float32` |
| `precision: bf16 / fp16` | `dtype: bfloat16 / float16` and `profile: max_speed` (a half precision is approximate, R-PROF) |
| `batch_size`, `max_batch_size` | `max_num_seqs` |
| `use_cpu: true` | `device: cpu` (`use_cpu: false` is dropped) |
| `profile` | kept when it names a profile (exact, shared_context, batching, max_speed), else dropped |
| `custom_ops_profile`, `compilation_cache_dir` | dropped |
| `provider: candle / ort / openvino` | `provider: model_runtime` (`ort` adds `engine: onnxruntime`) |
| `provider: http` + `external_model: NAME` | an attached replica: `endpoint` + `model` read from `global.model_catalog.external` |
| `device: migraphx:N` (deployment or replica) | `device: rocm:N`; 0.4.0's `metal:N` → `mps`, OpenVINO's `CPU` → `cpu` |
| `input: {max_tokens: 0}` | `max_tokens` dropped (0 set no budget); the rest of `input` is kept |
| top-level `version` | dropped |

Where 0.4.0 accepted something this server runs differently, the rewrite makes a choice and
says so in its change line (`(choice: …)`): `ort` runs the exported graph at dtype auto
whatever its `precision`; `fp16` on a CPU becomes float32; an OpenVINO GPU/NPU device becomes
the CPU; a 0.4.0 deployment without a device keeps 0.4.0's default, the CPU. What cannot be
expressed (an `external_model` with no endpoint, a precision with no dtype, two settings that
disagree) is refused with one line per problem naming the field. Keys keep their order; YAML
comments are not kept (pyyaml drops them), which the change list says.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from vllm_srun.domain.settings.profiles import MAX_SPEED
from vllm_srun.domain.settings.profiles import NAMES as PROFILE_NAMES

from .loader import CATALOG
from .schema import REMOVED_DEVICE_PREFIX, REMOVED_PROVIDERS, ConfigError
from .yaml_text import parse_yaml

PRECISION_TO_DTYPE = {
    "auto": "auto",
    "native": "auto",
    "fp32": "float32",
    "float32": "float32",
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
    "half": "float16",
}
HALF_PRECISIONS = ("bfloat16", "float16")  # their precision asks for profile max_speed (R-PROF-3)
DROPPED = {
    "custom_ops_profile": "faster kernels are chosen per model from its records",
    "compilation_cache_dir": "no longer used",
}
OVERFLOWS = ("reject", "truncate", "window")
KEPT = ("artifact", "revision")  # 0.4.0 fields that mean the same here (device and input: below)


class MigrationError(ConfigError):
    """The config names settings of older releases that cannot be rewritten without changing it."""


@dataclass(frozen=True)
class Migration:
    text: str  # the migrated YAML (the input, untouched, when nothing changed)
    changes: tuple[str, ...]  # one line per rewrite, `PATH: old → new` (+ ` (choice: …)`)

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
    if not isinstance(data, dict):
        return data, []
    changes: list[str] = []
    problems: list[str] = []
    if "version" in data:
        changes.append(f"version: {data['version']} removed (this config has no version field)")
        data = {key: value for key, value in data.items() if key != "version"}
    glob = data.get("global")
    catalog = glob.get("model_catalog") if isinstance(glob, dict) else None
    deployments = catalog.get("deployments") if isinstance(catalog, dict) else None
    if not isinstance(deployments, dict):
        return data, changes
    external = _external_models(catalog) if isinstance(catalog, dict) else {}
    rewritten = {
        name: _Deployment(f"deployments.{name}", spec, external, changes, problems).migrate()
        if isinstance(spec, dict)
        else spec
        for name, spec in deployments.items()
    }
    if problems:
        raise MigrationError(problems)
    if not changes:
        return data, []
    path = CATALOG.split(".")
    data = _with(data, path, rewritten)
    if isinstance(catalog, dict) and "external" in catalog:
        changes.append(
            "global.model_catalog.external: removed (its endpoints are now the attached replicas of the "
            "http deployments; LLM services are not served by vllm-sr serve)"
        )
        data = _with(data, path[:-1], {k: v for k, v in catalog.items() if k != "external"} | {path[-1]: rewritten})
    return data, changes


def _external_models(catalog: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """0.4.0's `global.model_catalog.external` entries by name (what `external_model` names)."""
    listed = catalog.get("external")
    entries = listed if isinstance(listed, list) else []
    return {entry["name"]: entry for entry in entries if isinstance(entry, dict) and isinstance(entry.get("name"), str)}


def _with(data: dict[str, Any], path: list[str], value: Any) -> dict[str, Any]:
    """A copy of `data` with the mapping at `path` replaced (other keys in their order)."""
    head, *rest = path
    return {key: (_with(item, rest, value) if rest else value) if key == head else item for key, item in data.items()}


class _Deployment:
    """One deployment's rewrite: its keys in order, each mapped, dropped or chosen, one change line each."""

    def __init__(
        self,
        path: str,
        spec: dict[str, Any],
        external: dict[str, dict[str, Any]],
        changes: list[str],
        problems: list[str],
    ) -> None:
        self.path, self.spec, self.external = path, spec, external
        self.changes, self.problems = changes, problems
        provider = spec.get("provider")
        self.provider = provider if isinstance(provider, str) and provider in REMOVED_PROVIDERS else None
        self.out: dict[str, Any] = {}

    def migrate(self) -> dict[str, Any]:
        for key, value in self.spec.items():
            self._migrate_key(key, value)
        spec = self.spec
        placed = any(spec.get(key) is not None for key in ("device", "replicas", "endpoint", "external_model"))
        if self.provider in ("candle", "ort", "openvino") and not placed and "use_cpu" not in spec:
            self.out["device"] = "cpu"
            self.changes.append(
                f"{self.path}.device: (unset) → cpu (choice: 0.4.0 placed a deployment without a device on the "
                "CPU; this server's default is auto)"
            )
        return self.out

    def kept(self, key: str, value: Any) -> None:
        """A 0.4.0 deployment says of every field what became of it, the unchanged ones too."""
        if self.provider is not None:
            self.note(f"{key}: {value} kept")

    def note(self, line: str) -> None:
        self.changes.append(f"{self.path}.{line}")

    def put(self, key: str, value: Any, because: str) -> None:
        """Write a rewritten key, refusing one that disagrees with what is already there."""
        explicit = self.spec.get(key, self.out.get(key))
        if explicit is not None and explicit != value:
            self.problems.append(
                f"{self.path}.{because}: rewrites to {key}: {value} but {key} is {explicit}; keep one of them"
            )
            return
        self.out.setdefault(key, value)

    def _migrate_key(self, key: str, value: Any) -> None:
        if key == "precision":
            self._precision(value)
        elif key in ("batch_size", "max_batch_size"):
            self.put("max_num_seqs", value, key)
            self.note(f"{key}: {value} → max_num_seqs: {value}")
        elif key == "use_cpu":
            _migrate_use_cpu(self.path, self.spec, value, self.out, self.changes, self.problems)
        elif key in DROPPED:
            self.note(f"{key}: removed ({DROPPED[key]})")
        elif key == "profile":
            self._profile(value)
        elif key == "provider" and self.provider is not None:
            self.out[key] = "model_runtime"
            self.note(f"provider: {value} → model_runtime")
            engine = REMOVED_PROVIDERS[value]
            if engine is not None:
                self.put("engine", engine, "provider")
                self.note(f"provider: {value} → engine: {engine}")
        elif key == "device":
            device = self._device(value)
            if device is not None:
                self.out.setdefault(key, device)
            if device == value:
                self.kept(key, value)
        elif key == "replicas" and isinstance(value, list):
            self.out[key] = [
                _migrate_replica(f"{self.path}.replicas[{index}]", replica, self.changes, self.problems)
                for index, replica in enumerate(value)
            ]
        elif key == "external_model":
            self._external(value)
        elif key == "input":
            self._input(value)
        elif key not in self.out:
            self.out[key] = value
            if key in KEPT:
                self.kept(key, value)

    def _precision(self, value: Any) -> None:
        dtype = PRECISION_TO_DTYPE.get(value.lower()) if isinstance(value, str) else None
        if self.provider == "http":
            self.note(f"precision: removed (an attached runtime computes in its own precision, {value!r} unused)")
            return
        if dtype is None:
            self.problems.append(
                f"{self.path}.precision: {value!r} has no dtype; set dtype to one of "
                "auto, float32, bfloat16, float16 and remove precision"
            )
            return
        choice = ""
        if self.provider == "ort" and dtype != "auto":
            choice = (
                f" (choice: the onnxruntime engine runs the exported graph at its own precision; {value} is unused)"
            )
            dtype = "auto"
        elif self.provider == "candle" and dtype == "float16" and self._on_cpu():
            choice = " (choice: float16 runs on GPUs only and this deployment is on the CPU)"
            dtype = "float32"
        self.put("dtype", dtype, "precision")
        if PRECISION_TO_DTYPE.get(value.lower()) in HALF_PRECISIONS:  # what was asked, whatever ran
            named = self.spec.get("profile")
            if isinstance(named, str) and named in PROFILE_NAMES:  # a profile of ours: it must agree
                self.put("profile", MAX_SPEED, "precision")
            else:  # none, or an old value that is dropped (`_profile`)
                self.out["profile"] = MAX_SPEED
            self.note(f"precision: {value} → dtype: {dtype}, profile: {MAX_SPEED} (approximate){choice}")
            return
        self.note(f"precision: {value} → dtype: {dtype}{choice}")

    def _profile(self, value: Any) -> None:
        if isinstance(value, str) and value in PROFILE_NAMES:
            self.out.setdefault("profile", value)
            self.kept("profile", value)
            return
        self.note(f"profile: removed ({value!r} is not a profile of this server: {', '.join(PROFILE_NAMES)})")

    def _on_cpu(self) -> bool:
        device = self.spec.get("device")
        return device is None or (isinstance(device, str) and device.lower() == "cpu")

    def _device(self, value: Any) -> Any:
        where = f"{self.path}.device"
        if not isinstance(value, str):
            return value
        if self.provider == "openvino":
            if value.lower() == "cpu":
                self.note(f"device: {value} → cpu")
            else:
                self.note(
                    f"device: {value} → cpu (choice: OpenVINO's {value} device has no engine here; "
                    "the CPU runs the model)"
                )
            return "cpu"
        if self.provider == "candle" and value.startswith("metal:"):
            self.note(f"device: {value} → mps (Apple's GPU, one per host)")
            return "mps"
        if self.provider == "http":
            self.note(f"device: removed (an attached runtime places itself; {value!r} unused)")
            return None
        return _migrate_device(where, value, self.changes, self.problems)

    def _external(self, name: Any) -> None:
        """0.4.0's http deployment: the external model's endpoint becomes an attached replica."""
        entry = self.external.get(name) if isinstance(name, str) else None
        endpoint = entry.get("llm_endpoint") if entry is not None else None
        address = endpoint.get("address") if isinstance(endpoint, dict) else None
        if not isinstance(address, str) or not address.strip():
            self.problems.append(
                f"{self.path}.external_model: {name!r} names no entry of global.model_catalog.external with an "
                "llm_endpoint address; write the attached runtime as 'endpoint' and 'model' instead"
            )
            return
        assert isinstance(endpoint, dict) and entry is not None
        scheme = "https" if str(endpoint.get("protocol", "")).lower() == "https" else "http"
        port = endpoint.get("port")
        url = f"{scheme}://{address.strip()}" + (f":{port}" if isinstance(port, int) else "")
        model = entry.get("llm_model_name") or endpoint.get("name") or name
        self.put("endpoint", url, "external_model")
        self.put("model", model, "external_model")
        self.note(
            f"external_model: {name} → endpoint: {url}, model: {model} (an attached replica; the runtime there "
            "must answer this server's API, e.g. another vllm-srun)"
        )

    def _input(self, value: Any) -> None:
        if self.provider == "http":
            self.note("input: removed (an attached runtime applies its own input budget)")
            return
        if not isinstance(value, dict):
            self.out["input"] = value  # the loader says what is wrong with it
            return
        budget = dict(value)
        tokens, overflow = budget.get("max_tokens"), budget.get("overflow")
        if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens < 0:
            self.problems.append(f"{self.path}.input.max_tokens: expected 0 or more tokens, got {tokens}")
        if overflow is not None and overflow not in OVERFLOWS:
            self.problems.append(
                f"{self.path}.input.overflow: expected one of {', '.join(OVERFLOWS)}, got {overflow!r}"
            )
        if tokens == 0:
            del budget["max_tokens"]
            self.note("input.max_tokens: 0 removed (0 set no budget: the model's own limit applies)")
        if budget:
            self.out["input"] = budget
            if budget == value:
                shown = ", ".join(f"{k} {v}" for k, v in budget.items())
                self.kept("input", f"{{{shown}}} (the input budget)")
        elif value:
            self.note("input: removed (nothing left to set)")


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
