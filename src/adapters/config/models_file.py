"""`vllm-srun serve --models FILE`: the models one worker serves, each with its own served name,
device, engine arguments and admission limits (R-ARG, R-ADM-1).

```yaml
models:
  - artifact: all-MiniLM-L6-v2
    name: minilm                 # the served name (default: the folder's name)
    max_num_seqs: 64
  - artifact: /models/tiny-decision
    device: cpu                  # default: the worker's --device
    max_model_len: 512
    max_queue: 16
```

A field left out takes the worker's flag (`--max-num-seqs`, `--device`, `--max-queue`, …), and
that flag's default when it was not given. The file is converted with msgspec like the front's
config (`loader.py`): every problem is one line (`models[1].dtype: expected …`), then the
rules that relate fields (a served name given twice, a dtype the device refuses, or the worker's
`--engine` plugin: `EngineRegistry.settings_refusal`). The worker's `--engine` serves every entry.
Nothing loads until there are no problems.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec
from msgspec import Meta

from vllm_srun.adapters.contracts import EngineSettings
from vllm_srun.adapters.engines.registry import EngineRegistry, installed_engines
from vllm_srun.domain import bounds
from vllm_srun.domain.admission import AdmissionLimits
from vllm_srun.domain.engine_args import EngineArgs
from vllm_srun.domain.worker_settings import ModelSpec

from .loader import conversion_problems
from .schema import ConfigError, Device, Name, Section, _range
from .yaml_text import parse_yaml

if TYPE_CHECKING:
    Dtype = str
else:
    Dtype = Literal[bounds.DTYPE.choices]

DtypeRefusal = Callable[[str, str], str | None]  # (dtype, device) -> why not, or None


class ModelEntry(Section, kw_only=True):
    artifact: Name
    name: Name | None = None
    device: Device | None = None
    max_num_seqs: Annotated[int, _range(bounds.MAX_NUM_SEQS)] | None = None
    max_num_batched_tokens: Annotated[int, _range(bounds.MAX_NUM_BATCHED_TOKENS)] | None = None
    batch_window_ms: Annotated[float, _range(bounds.BATCH_WINDOW_MS)] | None = None
    dtype: Dtype | None = None
    enable_shared_context: bool | None = None
    max_model_len: Annotated[int, _range(bounds.MAX_MODEL_LEN)] | None = None
    max_queue: Annotated[int, _range(bounds.MAX_QUEUE)] | None = None
    max_queued_tokens: Annotated[int, _range(bounds.MAX_QUEUED_TOKENS)] | None = None


class ModelsFile(Section, kw_only=True):
    models: Annotated[list[ModelEntry], Meta(min_length=1)]


def load_models_file(
    path: str | Path,
    *,
    flags: EngineArgs,
    device: str,
    engine: str,
    admission: AdmissionLimits,
    dtype_refusal: DtypeRefusal,
    engines: EngineRegistry | None = None,
) -> list[ModelSpec]:
    """The file's models, each field left out taken from the worker's flags; raises ConfigError
    (one line per problem) or OSError (the file cannot be read). ENGINES: where ENGINE's plugin
    is found (default: the installed ones)."""
    source = str(path)
    data = parse_yaml(Path(path).read_text(encoding="utf-8"))
    problems = conversion_problems(data, ModelsFile, source=source)
    if problems:
        raise ConfigError([f"{source}: {line}" for line in problems])
    entries = msgspec.convert(data, ModelsFile).models
    specs = [_spec(entry, flags, device, admission) for entry in entries]
    problems = _relation_problems(specs, engine, dtype_refusal, engines or installed_engines())
    if problems:
        raise ConfigError([f"{source}: {line}" for line in problems])
    return specs


def _spec(entry: ModelEntry, flags: EngineArgs, device: str, admission: AdmissionLimits) -> ModelSpec:
    def pick(name: str) -> Any:
        value = getattr(entry, name)
        return getattr(flags, name) if value is None else value

    args = EngineArgs(
        max_num_seqs=pick("max_num_seqs"),
        max_num_batched_tokens=pick("max_num_batched_tokens"),
        batch_window_ms=pick("batch_window_ms"),
        dtype=pick("dtype"),
        enable_shared_context=pick("enable_shared_context"),
        max_model_len=pick("max_model_len"),
    )
    limits = AdmissionLimits(
        admission.max_queue if entry.max_queue is None else entry.max_queue,
        admission.max_queued_tokens if entry.max_queued_tokens is None else entry.max_queued_tokens,
    )
    return ModelSpec(entry.artifact, args, name=entry.name, device=entry.device or device, admission=limits)


def _relation_problems(
    specs: list[ModelSpec], engine: str, dtype_refusal: DtypeRefusal, engines: EngineRegistry
) -> list[str]:
    problems = []
    seen: dict[str, int] = {}
    for index, spec in enumerate(specs):
        where = f"models[{index}]"
        name = spec.served_name
        if name in seen:
            problems.append(f"{where}: the served name {name!r} is taken by models[{seen[name]}]; give one a 'name'")
        seen.setdefault(name, index)
        device = "cpu" if spec.device in (None, "auto") else spec.device
        refusal = dtype_refusal(spec.args.dtype, device)
        if refusal:
            problems.append(f"{where}.dtype: {refusal}")
        refused = engines.settings_refusal(engine, EngineSettings(dtype=spec.args.dtype))
        if refused is not None:
            problems.append(f"{where}.{refused.setting}: {refused.reason}")
    return problems
