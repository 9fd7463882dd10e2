"""`vllm-sr serve` flags written into the canonical config (R-REP-1, R-ARG).

There is no separate data-parallel state: MODEL, `--engine`, `--platform`, `-dp`,
`--device-ids` and engine-argument flags rewrite the default deployment, and the result is
an ordinary `FrontConfig` that loads, validates and dumps like a file.

Placement rules:
- `-dp N --device-ids A,B,…` places N workers on the listed GPUs in turn
  (`-dp 2 --device-ids 0` = two on GPU 0; `-dp 2 --device-ids 0,1` = one each);
  `--device-ids` without `-dp` places one worker per id.
- A new GPU placement without ids takes the first N available GPUs and is refused when there
  are too few; it never piles workers on one card. A CPU placement is N × `{device: cpu}`.
- An existing placement is resized in its declared order: shrinking keeps the first N
  entries; growing appends workers of the same kind (CPU, or GPUs not yet used, in available
  order). Attached replicas (`endpoint`) can be dropped from the end but never invented.
- MODEL alone keeps the configured replicas and engine arguments (a `revision` pinned for a
  different artifact is dropped).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
from msgspec.structs import replace

from vllm_srun.adapters.engines.registry import EngineRegistry, installed_engines

from .loader import load_config_data
from .schema import (
    ENGINE_ARG_FIELDS,
    ConfigError,
    DecisionModelConfig,
    DeploymentConfig,
    FrontConfig,
    ReplicaConfig,
    SystemConfig,
)

PLATFORMS = ("auto", "cpu", "cuda", "rocm", "mps")
GPU_PLATFORMS = ("cuda", "rocm")


def apply_cli_overrides(
    config: FrontConfig,
    *,
    model: str | None = None,
    engine: str | None = None,
    platform: str | None = None,
    data_parallel_size: int | None = None,
    device_ids: Sequence[int] | None = None,
    engine_args: Mapping[str, Any] | None = None,
    available_gpus: Sequence[int] = (),
    engines: EngineRegistry | None = None,
) -> FrontConfig:
    """The config with the flags applied to the default deployment; raises ConfigError.

    `platform` "auto" or None keeps the configured platform (the CLI resolves auto before
    calling when it has to); `available_gpus` are the host's usable GPU ids, in order;
    `engines` the engine plugins `engine` may name (default: the installed ones).
    """
    engines = engines or installed_engines()
    args = {key: value for key, value in (engine_args or {}).items() if value is not None}
    placing = data_parallel_size is not None or bool(device_ids) or platform not in (None, "auto")
    if model is None and engine is None and not args and not placing:
        return config
    name = config.default_deployment_name()
    if name is None:
        raise ConfigError(
            [
                "deployments: several deployments and no system.decision_model.deployment; "
                "name the default deployment there so the flags know which one to change"
            ]
        )
    path = f"deployments.{name}"
    deployment = config.deployments.get(name)
    if deployment is None:
        if model is None:
            raise ConfigError([f"{path}: no such deployment to apply the flags to; pass MODEL"])
        deployment = DeploymentConfig(artifact=model)
    if model is not None and model != deployment.artifact:
        deployment = replace(deployment, artifact=model, revision=None)
    if engine is not None:
        refusal = engines.unknown(engine)
        if refusal is not None:
            raise ConfigError([f"--engine: {refusal}"])
        deployment = replace(deployment, engine=engine)
    unknown = sorted(set(args) - set(ENGINE_ARG_FIELDS))
    if unknown:
        raise ConfigError([f"engine argument '{key}': unknown" for key in unknown])
    deployment = replace(deployment, **args)
    if placing:
        deployment = place_workers(
            deployment,
            path=path,
            platform=platform,
            data_parallel_size=data_parallel_size,
            device_ids=list(device_ids or ()),
            available_gpus=list(available_gpus),
        )
    deployments = {**config.deployments, name: deployment}
    catalog = replace(config.global_.model_catalog, deployments=deployments)
    updated = replace(config, global_=replace(config.global_, model_catalog=catalog))
    if config.decision_deployment is None:  # written in upstream's place
        system = SystemConfig(decision_model=DecisionModelConfig(deployment=name))
        updated = replace(updated, global_=replace(updated.global_, model_catalog=replace(catalog, system=system)))
    return load_config_data(msgspec.to_builtins(updated), engines=engines)  # the same rules as a file


def place_workers(
    deployment: DeploymentConfig,
    *,
    path: str,
    platform: str | None,
    data_parallel_size: int | None,
    device_ids: list[int],
    available_gpus: list[int],
) -> DeploymentConfig:
    """The deployment with its workers placed by the rules in the module docstring."""
    if platform is not None and platform not in PLATFORMS:
        raise ConfigError([f"--platform: expected one of {', '.join(PLATFORMS)}, got {platform!r}"])
    if data_parallel_size is not None and data_parallel_size < 1:
        raise ConfigError([f"-dp: expected a worker count >= 1, got {data_parallel_size}"])
    wanted = None if platform in (None, "auto") else platform
    declared = _declared(deployment)
    kind = _kind_of(declared)
    if data_parallel_size is not None:
        count = data_parallel_size
    else:
        count = len(device_ids) if device_ids else max(1, len(declared))
    attached = any(replica.attached for replica in declared)
    if attached and (device_ids or (wanted and wanted != kind)):
        raise ConfigError(
            [
                f"{path}: has attached replicas; --platform and --device-ids place managed "
                "workers, so list the replicas in the config instead"
            ]
        )
    if device_ids:
        replicas = _on_listed_gpus(path, wanted or kind, count, device_ids)
    elif wanted is not None and wanted != kind:
        replicas = _new_placement(path, wanted, count, available_gpus)
    else:
        replicas = _resized(path, declared, kind, count, available_gpus)
    if not replicas:  # one worker, nothing placed: stays on `device: auto`
        return deployment
    if deployment.replicas is None and data_parallel_size is None and len(replicas) == 1:
        if replicas[0].attached:
            return deployment
        return replace(deployment, device=replicas[0].device)
    return replace(deployment, replicas=replicas, device=None, endpoint=None, model=None)


def _declared(deployment: DeploymentConfig) -> list[ReplicaConfig]:
    if deployment.replicas is not None:
        return list(deployment.replicas)
    if deployment.endpoint is not None:
        return [ReplicaConfig(endpoint=deployment.endpoint, model=deployment.model)]
    if deployment.device not in (None, "auto"):
        return [ReplicaConfig(device=deployment.device)]
    return []


def _kind_of(replicas: list[ReplicaConfig]) -> str | None:
    """cpu, mps, cuda, rocm, auto, attached, mixed; None for no placement."""
    kinds = {"attached" if replica.attached else (replica.device or "auto").split(":")[0] for replica in replicas}
    if not kinds:
        return None
    return kinds.pop() if len(kinds) == 1 else "mixed"


def _on_listed_gpus(path: str, kind: str | None, count: int, ids: list[int]) -> list[ReplicaConfig]:
    if kind not in GPU_PLATFORMS:
        raise ConfigError([f"{path}: --device-ids places workers on GPUs; pass --platform cuda or --platform rocm"])
    if any(gpu < 0 for gpu in ids) or len(set(ids)) != len(ids):
        raise ConfigError(
            [
                f"--device-ids: list each GPU once as an index >= 0, got {ids}; "
                "-dp N with fewer ids places several workers on one GPU"
            ]
        )
    if len(ids) > count:
        raise ConfigError([f"--device-ids: {len(ids)} GPUs for {count} workers; pass -dp {len(ids)} or fewer ids"])
    return [ReplicaConfig(device=f"{kind}:{ids[i % len(ids)]}") for i in range(count)]


def _new_placement(path: str, kind: str, count: int, available: list[int]) -> list[ReplicaConfig]:
    if kind in GPU_PLATFORMS:
        gpus = _free_gpus(path, kind, count, available, "")
        return [ReplicaConfig(device=f"{kind}:{gpu}") for gpu in gpus]
    return [ReplicaConfig(device=kind) for _ in range(count)]


def _resized(
    path: str, declared: list[ReplicaConfig], kind: str | None, count: int, available: list[int]
) -> list[ReplicaConfig]:
    if count <= len(declared):
        return declared[:count]
    if kind is None and count == 1:
        return []
    if kind in ("cpu", "mps"):
        return declared + [ReplicaConfig(device=kind) for _ in range(count - len(declared))]
    if kind in GPU_PLATFORMS:
        used = {int(replica.device.split(":")[1]) for replica in declared if replica.device}
        unused = [gpu for gpu in available if gpu not in used]
        free = _free_gpus(path, kind, count - len(declared), unused, "more ")
        return declared + [ReplicaConfig(device=f"{kind}:{gpu}") for gpu in free]
    if any(replica.attached for replica in declared):
        reason = "attached replicas cannot be added from flags; list their endpoints"
    else:
        reason = "no placement of one kind to grow; pass --platform cpu|cuda|rocm or --device-ids"
    raise ConfigError([f"{path}: cannot place {count} workers: {reason}"])


def _free_gpus(path: str, kind: str, count: int, available: list[int], more: str) -> list[int]:
    if len(available) < count:
        listed = ", ".join(map(str, available)) or "none"
        raise ConfigError(
            [
                f"{path}: {count} {more}{kind} worker(s) need {count} GPU(s) but only "
                f"{len(available)} are available ({listed}); pass --device-ids to place several "
                "workers on one GPU"
            ]
        )
    return available[:count]
