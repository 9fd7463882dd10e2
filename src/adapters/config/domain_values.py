"""The settings records as the domain's value types: one served model's spec (`model_spec`,
its Hub revision held apart by `split_revision`) and the connection limits (`connection_limits`),
converted here and nowhere else; their fields' names are the settings' names."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from vllm_srun.adapters.config.model_args import ModelArgs
from vllm_srun.adapters.hub import parse_hub_id
from vllm_srun.domain.errors import ModelNotFound
from vllm_srun.domain.security.connections import ConnectionLimits
from vllm_srun.domain.worker.worker_settings import ModelSpec


def split_revision(artifact: str, revision: str | None = None) -> tuple[str, str | None]:
    """(artifact, revision) of a model argument: a Hub id `ORG/NAME@REV` as (`ORG/NAME`, REV);
    REVISION (`--revision`, or a models file entry's) applies to a Hub id that names none. A path
    that exists is never a Hub id. ModelNotFound (one line): two different revisions, or a
    revision for what is no Hub id."""
    exists = Path(artifact).expanduser().exists()
    ref = None if exists else parse_hub_id(artifact, revision)
    if ref is not None:
        return ref.repo, ref.revision
    if revision is not None:
        raise ModelNotFound(
            f"--revision {revision}: {artifact} is not a Hugging Face id (ORG/NAME); a local folder, "
            "a store or built-in name has no Hub revision"
        )
    return artifact, None


def model_spec(
    artifact: str, args: ModelArgs, *, name: str | None = None, device: str | None = None, **more: Any
) -> ModelSpec:
    """The domain's spec of one served model: ARGS converted to its value types (its family and
    memory budget included); MORE: the models file's other fields (`ModelSpec`: revision, options)."""
    return ModelSpec(
        artifact,
        args.engine_args(),
        name=name,
        device=device,
        admission=args.admission(),
        engine=args.engine,
        family=args.family,
        memory_budget_gib=args.memory_budget_gib,
        **{key: value for key, value in more.items() if value is not None},
    )


CONNECTION_SETTINGS = tuple(setting for setting, _ in ConnectionLimits().valued())
_CONNECTION_FIELDS = {
    setting.name: field.name
    for (setting, _), field in zip(ConnectionLimits().valued(), dataclasses.fields(ConnectionLimits))
}


def connection_limits(record: Any) -> ConnectionLimits:
    """The connection flags of either CLI (a record or a parsed namespace) as the domain's limits."""
    return ConnectionLimits(**{field: getattr(record, name) for name, field in _CONNECTION_FIELDS.items()})
