"""The canonical config of `vllm-sr serve` as msgspec Structs (R-ARG, R-REP-1, R-REP-2, R-REP-5).

```yaml
global:
  router: {enabled: false}
  api_key_file: /etc/vllm-sr/api-keys           # optional; `--api-key-file` wins
  model_catalog:
    deployments:
      primary:
        provider: model_runtime
        artifact: all-MiniLM-L6-v2
        replicas: [{device: cpu}, {device: cpu}]   # or {endpoint: http://host:8100, model: NAME}
        max_num_seqs: 256
        timeout_ms: 5000
        outlier_detection: {consecutive_timeouts: 3, base_ejection_ms: 30000}
    system:
      decision_model: {deployment: primary}   # upstream's place; a root-level `system:` is the same
```

Every field left out keeps the runtime's default (None here). A deployment's engine and engine
arguments are the settings record's (`model_args.ServingArgs`, declared once with their bounds from
`domain/settings/bounds.py`), so the loader reports range problems from the types; the rules that relate
fields to each other live in `rules.py`. Unknown fields are refused everywhere; every section is
frozen (a changed config is a new one, `msgspec.structs.replace`).
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta, Struct

from vllm_srun.adapters.config.declarations import declare, declared
from vllm_srun.adapters.config.model_args import ServingArgs
from vllm_srun.domain.fleet.ejection import ONE_HOUR_MS, OutlierDetection
from vllm_srun.domain.settings import bounds

DEFAULT_DEPLOYMENT = "primary"
HTTP_ENDPOINT_PATTERN = r"https?://([^\s/?#:@\[\]]+|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?(/[^\s?#]*)?"
UNIX_ENDPOINT_PATTERN = r"unix:///[^\s?#]*[^\s?#/]"  # an absolute socket path
ENDPOINT_PATTERN = f"^({HTTP_ENDPOINT_PATTERN}|{UNIX_ENDPOINT_PATTERN})$"
DEPLOYMENT_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
DNS_NAME_PATTERN = r"^(?=.{1,253}\.?$)[A-Za-z0-9_]([A-Za-z0-9_-]{0,62})(\.[A-Za-z0-9_]([A-Za-z0-9_-]{0,62}))*\.?$"
NAMESERVER_PATTERN = r"^([0-9.]+|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?$"  # an address (no name to resolve first)
MAX_REPLICAS = 64

# How a bad value of a field is described: "expected <hint>, got <value>".
FIELD_HINTS = {
    "device": bounds.REPLICA_DEVICE.rule(),
    "endpoint": (
        "an http:// or https:// URL such as http://host:8100 (no query, fragment or user), "
        "or unix:///ABSOLUTE/SOCKET/PATH"
    ),
    "dtype": bounds.DTYPE.rule(),
    "profile": bounds.PROFILE.rule(),
    "revision": "a 40-hex commit of the Hub repository",
    "engine": bounds.ENGINE.rule(),
    "provider": "model_runtime",
}

Device = Annotated[str, Meta(pattern=f"^({bounds.REPLICA_DEVICE.pattern})$")]
Endpoint = Annotated[str, Meta(pattern=ENDPOINT_PATTERN)]
Name = Annotated[str, Meta(min_length=1, pattern=r"^\S(.*\S)?$")]
EnvName = Annotated[str, Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]


class ConfigError(ValueError):
    """A refused config; `problems` holds one line per problem (R-ARG-2)."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = list(problems)


# Settings of older releases, refused with a pointer to `vllm-sr config migrate` (R-ARG-1).
REMOVED_DEPLOYMENT_FIELDS = {
    "precision": "now 'dtype': auto, float32, bfloat16 or float16",
    "batch_size": "now 'max_num_seqs'",
    "max_batch_size": "now 'max_num_seqs'",
    "use_cpu": "now 'device: cpu'",
    "custom_ops_profile": "faster kernels are chosen per model from its records",
    "compilation_cache_dir": "no longer used",
}
REMOVED_PROVIDERS = {"candle": None, "ort": "onnxruntime", "openvino": None, "http": None}  # -> engine
REMOVED_DEVICE_PREFIX = "migraphx:"


def removed_value_hint(field: str, value: object) -> str | None:
    """Why a value of `field` is a removed spelling, or None."""
    if field == "device" and isinstance(value, str) and value.startswith(REMOVED_DEVICE_PREFIX):
        return f"'{value}' is a removed device name (now 'rocm:{value.split(':', 1)[1]}')"
    if field == "provider" and isinstance(value, str) and value in REMOVED_PROVIDERS:
        return f"provider '{value}' was removed (now 'model_runtime')"
    return None


class Section(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Base of every config section: frozen, unknown fields refused, keyword construction only."""


class OutlierDetectionConfig(Section, frozen=True, kw_only=True):
    consecutive_timeouts: Annotated[int, Meta(ge=0)] | None = None
    base_ejection_ms: Annotated[int, Meta(ge=1, le=ONE_HOUR_MS)] | None = None
    max_ejection_ms: Annotated[int, Meta(ge=1, le=ONE_HOUR_MS)] | None = None
    max_ejection_percent: Annotated[int, Meta(ge=0, le=100)] | None = None

    def to_domain(self) -> OutlierDetection:
        defaults = OutlierDetection()
        return OutlierDetection(
            consecutive_timeouts=_or(self.consecutive_timeouts, defaults.consecutive_timeouts),
            base_ejection_ms=_or(self.base_ejection_ms, defaults.base_ejection_ms),
            max_ejection_ms=self.max_ejection_ms,
            max_ejection_percent=_or(self.max_ejection_percent, defaults.max_ejection_percent),
        )


class ReplicaConfig(Section, frozen=True, kw_only=True):
    """A managed worker (`device`), an attached runtime (`endpoint` + its `model`), or every
    runtime a DNS name resolves to (`dns` + `port` + `model`; `front/discovery.py`): resolved
    every `resolve_every_ms` (default 5000) by the system's resolver, or by `nameserver`."""

    device: Device | None = None
    endpoint: Endpoint | None = None
    model: Name | None = None
    dns: Annotated[str, Meta(pattern=DNS_NAME_PATTERN)] | None = None
    port: Annotated[int, Meta(ge=1, le=65535)] | None = None
    scheme: Literal["http", "https"] | None = None
    resolve_every_ms: Annotated[int, Meta(ge=100, le=ONE_HOUR_MS)] | None = None
    nameserver: Annotated[str, Meta(pattern=NAMESERVER_PATTERN)] | None = None

    @property
    def attached(self) -> bool:
        return self.endpoint is not None or self.dns is not None


class DeploymentConfig(ServingArgs, frozen=True, kw_only=True):
    """One deployment: its artifact, placement, dispatch and (inherited from `ServingArgs`: its
    engine, engine arguments and worker limits, R-ARG, R-ADM-1) what its workers are told."""

    provider: Literal["model_runtime"] = "model_runtime"
    artifact: Name
    revision: Name | None = None
    # the model id the front publishes for this deployment (upstream's native model name): clients
    # may name it in `model` beside the deployment's name, and answers carry it as their `model`
    public_name: Name | None = None
    # placement: `replicas`, or the single-worker shorthand `device` / `endpoint` + `model`
    device: Device | None = None
    endpoint: Endpoint | None = None
    model: Name | None = None
    replicas: Annotated[list[ReplicaConfig], Meta(min_length=1, max_length=MAX_REPLICAS)] | None = None
    # dispatch and outlier ejection (R-REP-3, R-REP-5)
    timeout_ms: (
        Annotated[int, declare(bounds.TIMEOUT_MS, "the default deployment's request timeout, in milliseconds")] | None
    ) = None
    outlier_detection: OutlierDetectionConfig | None = None
    # endpoint replicas' door (R-AUTH-3, R-AUTH-4): the internal token the front sends them (from a
    # file, or an environment variable of the front; never in this file) and the CA file their
    # https certificates are verified with (default: the system's CAs)
    internal_token_file: Name | None = None
    internal_token_env: EnvName | None = None
    ca_file: Name | None = None

    def placement(self) -> list[ReplicaConfig]:
        """The replicas this deployment runs; the shorthand is one replica (device auto)."""
        if self.replicas is not None:
            return list(self.replicas)
        if self.endpoint is not None:
            return [ReplicaConfig(endpoint=self.endpoint, model=self.model)]
        return [ReplicaConfig(device=self.device or "auto")]

    def outlier_policy(self) -> OutlierDetection:
        return (self.outlier_detection or OutlierDetectionConfig()).to_domain()


# what the front's flags may write into the default deployment: every declared field but the engine
# (`-e ENGINE`)
ENGINE_ARG_FIELDS = tuple(d.name for d in declared(DeploymentConfig) if d.setting is not bounds.ENGINE)


class RouterConfig(Section, frozen=True, kw_only=True):
    enabled: bool = False


class DecisionModelConfig(Section, frozen=True, kw_only=True):
    deployment: Name | None = None


class SystemConfig(Section, frozen=True, kw_only=True):
    decision_model: DecisionModelConfig = msgspec.field(default_factory=DecisionModelConfig)


class ModelCatalogConfig(Section, frozen=True, kw_only=True):
    deployments: dict[str, DeploymentConfig] = msgspec.field(default_factory=dict)
    system: SystemConfig = msgspec.field(default_factory=SystemConfig)  # upstream's place of the decision model


class GlobalConfig(Section, frozen=True, kw_only=True):
    router: RouterConfig = msgspec.field(default_factory=RouterConfig)
    model_catalog: ModelCatalogConfig = msgspec.field(default_factory=ModelCatalogConfig)
    # the front's key file (R-AUTH-1), as `--api-key-file` (which wins when both are given): its keys
    # are asked for at the front, its tenant policies apply in the managed workers (R-FAIR-1)
    api_key_file: Name | None = None


class FrontConfig(Section, frozen=True, kw_only=True):
    global_: GlobalConfig = msgspec.field(name="global", default_factory=GlobalConfig)
    # the root-level place of the decision model (ours before upstream's
    # `global.model_catalog.system`); both may be written when they agree (`rules.py`)
    system: SystemConfig = msgspec.field(default_factory=SystemConfig)

    @property
    def deployments(self) -> dict[str, DeploymentConfig]:
        return self.global_.model_catalog.deployments

    @property
    def decision_deployment(self) -> str | None:
        """The decision model's deployment: `global.model_catalog.system.decision_model.deployment`,
        else the root-level `system.decision_model.deployment`; None when neither is written."""
        named = self.global_.model_catalog.system.decision_model.deployment
        return named if named is not None else self.system.decision_model.deployment

    def default_deployment_name(self) -> str | None:
        """The deployment `vllm-sr serve` flags apply to: the decision model's deployment,
        else the only deployment, else `primary` when there is none; None when ambiguous."""
        named = self.decision_deployment
        if named is not None:
            return named
        if len(self.deployments) == 1:
            return next(iter(self.deployments))
        if not self.deployments:
            return DEFAULT_DEPLOYMENT
        return None


def _or(value: int | None, default: int) -> int:
    return default if value is None else value
