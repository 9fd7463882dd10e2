"""`vllm-srun serve --models FILE`: the models one worker serves, each with its own served name,
device, engine arguments and admission limits (R-ARG, R-ADM-1).

```yaml
models:
  - artifact: all-MiniLM-L6-v2   # or `model:`, upstream's spelling
    name: minilm                 # the served name (default: the folder's name)
    max_num_seqs: 64
    input: {max_tokens: 256, overflow: truncate}   # the input budget (default: the model's limit, reject)
  - artifact: /models/tiny-decision
    device: cpu                  # default: the worker's --device
    max_model_len: 512
    max_queue: 16
    profile: shared_context      # R-PROF (default: exact)
    family: decision             # force a family (default: detected); refused when it cannot read the package
    memory_budget_gib: 2         # refuse the model when its weights would hold more
    options: {break_even_tokens: 0}   # the family's own options (refused when it has no such option)
  - model: BAAI/bge-small-en-v1.5   # a Hub id ...
    revision: 0123456789abcdef0123456789abcdef01234567   # ... at this 40-hex commit
```

An entry is the per-model settings of the settings record (`model_args.ModelArgs`: engine, engine
arguments, admission limits) plus its artifact, served name and device. A field left out takes
the worker's flag (`--max-num-seqs`, `--device`, `--engine`, `--max-queue`, `--profile`, …), and
that flag's default when it was not given. Upstream's entry fields are read too: `model` (our
`artifact`), `profile`, `family`, `memory_budget_gib` (per-model settings, like the engine
arguments: `--family` and `--memory-budget` are their defaults), `options` and `revision` — a
40-hex commit of a Hub id (`ORG/NAME`), resolved as `ORG/NAME@REVISION`; a local folder, a store
or built-in name has no Hub revision, so one is refused there in one line. An artifact written
`ORG/NAME@REV` names its branch, tag or commit itself (served as `NAME`, like `vllm-srun serve`'s
MODEL arguments: `settings.split_revision`). The file is converted with msgspec like the front's config
(`loader.py`): every problem is one line (`models[1].dtype: expected …`), then the rules that
relate fields (a served name given twice, a dtype the device refuses, an entry's engine that is
not installed or whose plugin refuses its settings: `EngineRegistry.unknown`,
`EngineRegistry.settings_refusal`). Nothing loads until there are no problems.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from vllm_srun.adapters.contracts import EngineSettings
from vllm_srun.adapters.engines.registry import EngineRegistry, installed_engines
from vllm_srun.adapters.hub import parse_hub_id
from vllm_srun.domain.errors import ModelNotFound
from vllm_srun.domain.settings import bounds
from vllm_srun.domain.settings.profiles import settings_refusal
from vllm_srun.domain.worker.worker_settings import ModelSpec

from .domain_values import model_spec, split_revision
from .loader import conversion_problems
from .model_args import ModelArgs
from .schema import ConfigError, Device, Name, Section
from .spellings import canonical_models_file
from .yaml_text import parse_yaml

DtypeRefusal = Callable[[str, str], str | None]  # (dtype, device) -> why not, or None


REVISION_PATTERN = r"^[0-9a-f]{40}$"


class ModelEntry(ModelArgs, frozen=True, kw_only=True):
    """One model of the file: what it serves and where, and its own per-model settings."""

    artifact: Name
    name: Name | None = None
    device: Device | None = None
    revision: Annotated[str, Meta(pattern=REVISION_PATTERN)] | None = None
    # `family` and `memory_budget_gib` are per-model settings (`ModelArgs`, `--family`, `--memory-budget`)
    options: dict[str, Any] | None = None


class ModelsFile(Section, frozen=True, kw_only=True):
    models: Annotated[list[ModelEntry], Meta(min_length=1)]


def load_models_file(
    path: str | Path,
    *,
    flags: ModelArgs,
    device: str,
    dtype_refusal: DtypeRefusal,
    engines: EngineRegistry | None = None,
) -> list[ModelSpec]:
    """The file's models, each field left out taken from the worker's FLAGS (and DEVICE); raises
    ConfigError (one line per problem) or OSError (the file cannot be read). ENGINES: where each
    entry's engine plugin is found (default: the installed ones)."""
    source = str(path)
    data = parse_yaml(Path(path).read_text(encoding="utf-8"))
    data, problems = canonical_models_file(data)
    problems += conversion_problems(data, ModelsFile, source=source)
    if problems:
        raise ConfigError([f"{source}: {line}" for line in problems])
    entries = [entry.over(flags) for entry in msgspec.convert(data, ModelsFile).models]
    specs = []
    for entry in entries:
        # `ORG/NAME@REV` as the artifact: held apart like `revision` (a conflict is an entry problem)
        artifact, revision = entry.artifact, entry.revision
        if revision is None:
            artifact, revision = split_revision(artifact)
        specs.append(
            model_spec(
                artifact,
                entry,
                name=entry.name,
                device=entry.device or device,
                revision=revision,
                options=entry.options,
            )
        )
    problems = [f"models[{i}]: {line}" for i, entry in enumerate(entries) for line in _entry_problems(entry)]
    problems += _relation_problems(specs, dtype_refusal, engines or installed_engines())
    if problems:
        raise ConfigError([f"{source}: {line}" for line in problems])
    return specs


def _entry_problems(entry: ModelEntry) -> list[str]:
    """What one entry's own fields refuse together: a profile its settings contradict (R-PROF-3),
    a revision of what is not a Hub id."""
    problems = []
    refusal = settings_refusal(entry.profile, entry.enable_shared_context, entry.dtype, entry.device)
    if refusal:
        problems.append(f"profile: {refusal}")
    if entry.revision is not None and "@" in entry.artifact and is_hub_id(entry.artifact.split("@", 1)[0]):
        problems.append(f"revision: {entry.artifact} names its revision already; give one")
    elif entry.revision is not None and not is_hub_id(entry.artifact):
        problems.append(
            f"revision: {entry.artifact} is not a Hub id (ORG/NAME); a local folder, a store or built-in name "
            "has no Hub revision"
        )
    return problems


def is_hub_id(artifact: str) -> bool:
    """Whether ARTIFACT is written as a Hub repository id (`ORG/NAME`, no revision: the entry's
    `revision` says it) rather than a path, a store or a built-in name (`hub.parse_hub_id`)."""
    if "@" in artifact or Path(artifact).expanduser().exists():
        return False
    try:
        return parse_hub_id(artifact) is not None
    except ModelNotFound:  # pragma: no cover - only a revision conflict raises, and none is given
        return False


def _relation_problems(specs: list[ModelSpec], dtype_refusal: DtypeRefusal, engines: EngineRegistry) -> list[str]:
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
        engine = spec.engine or bounds.ENGINE.default
        unknown = engines.unknown(engine)
        if unknown is not None:
            problems.append(f"{where}.engine: {unknown}")
            continue
        refused = engines.settings_refusal(engine, EngineSettings(dtype=spec.args.dtype))
        if refused is not None:
            problems.append(f"{where}.{refused.setting}: {refused.reason}")
    return problems
