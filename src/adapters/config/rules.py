"""Config rules that relate fields to each other (R-REP-1, R-REP-2, R-ARG-2, R-LEN).

They run on the parsed YAML (plain dicts and lists) after `loader.py` has reported what the
types refuse, so they look only at values of the right shape and report one line per problem.
A deployment's `engine` is checked against the engine registry: installed (or auto), and the
settings its plugin refuses whatever the model (`engine_problems`).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from vllm_srun.adapters.contracts import EngineSettings
from vllm_srun.adapters.engines.registry import EngineRegistry
from vllm_srun.domain.settings import bounds
from vllm_srun.domain.settings.profiles import settings_refusal

from .schema import DEPLOYMENT_NAME_PATTERN, ENDPOINT_PATTERN


def relation_problems(data: dict[Any, Any], engines: EngineRegistry) -> list[str]:
    problems: list[str] = []
    glob = data.get("global")
    glob = glob if isinstance(glob, dict) else {}
    router = glob.get("router")
    if isinstance(router, dict) and router.get("enabled") is True:
        problems.append(
            "global.router.enabled: LLM routing is out of scope for vllm-sr serve "
            "(it serves non-generative models); set it to false or remove it"
        )
    catalog = glob.get("model_catalog")
    deployments = catalog.get("deployments") if isinstance(catalog, dict) else None
    deployments = deployments if isinstance(deployments, dict) else {}
    attached_by: dict[tuple[str, Any], str] = {}  # (endpoint, model) → the deployment attaching it
    for name, deployment in deployments.items():
        path = f"deployments.{name}"
        if not isinstance(name, str) or not re.match(DEPLOYMENT_NAME_PATTERN, name):
            problems.append(
                f"{path}: a deployment name is letters, digits, '.', '_' or '-', starting with a letter or digit"
            )
        if isinstance(deployment, dict):
            problems.extend(deployment_problems(path, deployment, engines))
            for where, entry in _placements(path, deployment):
                identity = endpoint_identity(entry.get("endpoint"))
                if identity is None:
                    continue
                other = attached_by.setdefault((identity, entry.get("model")), path)
                if other != path:
                    problems.append(
                        f"{where}: {entry['endpoint']} model {entry.get('model')} is already a replica of {other} "
                        "(two deployments would each count its load as their own)"
                    )
    published: dict[Any, str] = {}  # a public_name → the deployment publishing it
    for name, deployment in deployments.items():
        public = deployment.get("public_name") if isinstance(deployment, dict) else None
        if not isinstance(public, str):
            continue
        if public in deployments and public != name:
            problems.append(f"deployments.{name}.public_name: '{public}' is the name of another deployment")
        elif public in published:
            problems.append(
                f"deployments.{name}.public_name: '{public}' is published by deployments.{published[public]} too"
            )
        published.setdefault(public, name)
    targets = {
        place: _decision_target(where)
        for place, where in (("global.model_catalog.system", catalog), ("system", data))
        if isinstance(where, dict)
    }
    named = {place: target for place, target in targets.items() if isinstance(target, str)}
    for place, target in named.items():
        if target not in deployments:
            known = ", ".join(map(str, deployments)) or "none are configured"
            problems.append(f"{place}.decision_model.deployment: no deployment named '{target}' ({known})")
    if len(set(named.values())) > 1:
        problems.append(
            "system.decision_model.deployment and global.model_catalog.system.decision_model.deployment "
            f"name different deployments ({named['system']}, {named['global.model_catalog.system']}); keep one"
        )
    return problems


def _decision_target(holder: dict[Any, Any]) -> Any:
    """The deployment a `system.decision_model` under HOLDER names (None: none written)."""
    system = holder.get("system")
    decision = system.get("decision_model") if isinstance(system, dict) else None
    return decision.get("deployment") if isinstance(decision, dict) else None


def deployment_problems(path: str, d: dict[str, Any], engines: EngineRegistry) -> list[str]:
    """Placement and engine-argument rules of one deployment (raw YAML mapping)."""
    problems: list[str] = []
    replicas = d.get("replicas")
    if replicas is not None:
        problems.extend(
            f"{path}: 'replicas' cannot be combined with a deployment-level '{field}' (give each replica its own)"
            for field in ("device", "endpoint", "model")
            if d.get(field) is not None
        )
    elif d.get("endpoint") is not None:
        problems.extend(_placement_problems(path, d, "an attached deployment"))
    elif d.get("model") is not None:
        problems.append(f"{path}: 'model' names the model of an attached runtime and needs 'endpoint'")
    listed = replicas if isinstance(replicas, list) else []
    entries = [item for item in listed if isinstance(item, dict)]
    seen: dict[str, int] = {}  # an endpoint's identity → the replica that listed it first
    for index, replica in enumerate(listed):
        if not isinstance(replica, dict):
            continue
        where = f"{path}.replicas[{index}]"
        if replica.get("dns") is not None or any(replica.get(f) is not None for f in DNS_ONLY_FIELDS):
            problems.extend(_dns_problems(where, replica))
            continue
        problems.extend(_placement_problems(where, replica, "an attached replica"))
        if replica.get("device") is None and replica.get("endpoint") is None:
            problems.append(f"{where}: needs 'device' (a managed worker) or 'endpoint' (an attached runtime)")
        identity = endpoint_identity(replica.get("endpoint"))
        if identity is not None and identity in seen:
            problems.append(
                f"{where}: endpoint {replica['endpoint']} is already replicas[{seen[identity]}] "
                "(one runtime is one replica; run another runtime to add capacity)"
            )
        elif identity is not None:
            seen[identity] = index
    attached = d.get("endpoint") is not None or any(r.get("endpoint") or r.get("dns") for r in entries)
    problems.extend(
        f"{path}.{field}: refused on a deployment with an attached endpoint; "
        f"pass --{field.replace('_', '-')} to the attached runtime itself"
        for field in (
            "max_model_len",
            "max_request_tokens",
            "max_queue",
            "max_queued_tokens",
            "input_max_tokens",
            "input_overflow",
        )
        if attached and d.get(field) is not None
    )
    devices = [d.get("device")] + [r.get("device") for r in entries]
    if d.get("dtype") == "float16" and "cpu" in devices:
        problems.append(f"{path}.dtype: float16 runs on GPUs only, and a worker is on the CPU")
    problems.extend(_profile_problems(path, d, devices))
    problems.extend(engine_problems(path, d, engines))
    problems.extend(_outlier_problems(path, d.get("outlier_detection")))
    return problems


def _profile_problems(path: str, d: dict[str, Any], devices: list[Any]) -> list[str]:
    """A deployment's profile against its other settings (R-PROF-3), once: a shared-context
    switch against it, or a half precision on a CPU worker under a profile but max_speed."""
    profile, shared, dtype = d.get("profile"), d.get("enable_shared_context"), d.get("dtype")
    if not (profile is None or bounds.PROFILE.accepts(profile)) or not isinstance(shared, (bool, type(None))):
        return []  # the schema says what is wrong with the value
    device = "cpu" if "cpu" in devices else None
    refusal = settings_refusal(profile, shared, dtype if isinstance(dtype, str) else None, device)
    return [f"{path}: {refusal}"] if refusal else []


def engine_problems(path: str, d: dict[str, Any], engines: EngineRegistry) -> list[str]:
    """A deployment's `engine`: auto or installed (the registry's one line naming the installed
    ones), then what its plugin refuses of the deployment's settings (e.g. its `dtype`)."""
    engine = d.get("engine")
    if not isinstance(engine, str) or not bounds.ENGINE.accepts(engine):
        return []  # absent, or badly spelled: the schema says so
    unknown = engines.unknown(engine)
    if unknown is not None:
        return [f"{path}.engine: {unknown}"]
    dtype = d.get("dtype")
    asked = EngineSettings(dtype=dtype if isinstance(dtype, str) and bounds.DTYPE.accepts(dtype) else "auto")
    refused = engines.settings_refusal(engine, asked)
    return [] if refused is None else [f"{path}.{refused.setting}: {refused.reason}"]


def endpoint_identity(endpoint: Any) -> str | None:
    """The runtime an endpoint reaches, spelled one way (scheme and host in lower case, the
    port explicit, no trailing slash): `http://H:80/` and `http://h` are one runtime. None for
    a value that is not an endpoint (the schema reports it) or whose port is out of range."""
    if not isinstance(endpoint, str) or not re.match(ENDPOINT_PATTERN, endpoint):
        return None
    url = urlsplit(endpoint)
    if url.scheme == "unix":  # the socket's absolute path, as written
        return f"unix://{url.path}"
    try:
        port = url.port if url.port is not None else (443 if url.scheme.lower() == "https" else 80)
    except ValueError:
        return None
    if port == 0:
        return None
    host = url.hostname or ""
    return f"{url.scheme.lower()}://{f'[{host}]' if ':' in host else host}:{port}{url.path.rstrip('/')}"


def _placements(path: str, deployment: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(where, entry) of each placement a deployment writes: its replicas, or itself."""
    replicas = deployment.get("replicas")
    if isinstance(replicas, list):
        return [(f"{path}.replicas[{i}]", r) for i, r in enumerate(replicas) if isinstance(r, dict)]
    return [(path, deployment)]


def _placement_problems(path: str, entry: dict[str, Any], what: str) -> list[str]:
    problems = []
    endpoint = entry.get("endpoint")
    if isinstance(endpoint, str) and re.match(ENDPOINT_PATTERN, endpoint):
        port = re.match(r"^[^:]+://(?:\[[^\]]*\]|[^/:]*)(?::(\d+))?", endpoint)
        if port and port[1] is not None and not 1 <= int(port[1]) <= 65535:
            problems.append(f"{path}.endpoint: port {int(port[1])} is out of range (1-65535), got {endpoint!r}")
    if entry.get("endpoint") is not None:
        if entry.get("device") is not None:
            problems.append(f"{path}: 'device' cannot be combined with 'endpoint' (an attached runtime places itself)")
        if entry.get("model") is None:
            problems.append(f"{path}: {what} ('endpoint') names its model with 'model'")
    elif entry.get("model") is not None:
        problems.append(
            f"{path}: 'model' is only for an attached runtime ('endpoint'); "
            "a managed worker serves the deployment's artifact"
        )
    return problems


DNS_ONLY_FIELDS = ("port", "scheme", "resolve_every_ms", "nameserver")


def _dns_problems(path: str, entry: dict[str, Any]) -> list[str]:
    """A replica found through DNS (`dns` + `port` + `model`, `front/discovery.py`)."""
    if entry.get("dns") is None:
        named = [f"'{f}'" for f in DNS_ONLY_FIELDS if entry.get(f) is not None]
        verb = "is" if len(named) == 1 else "are"
        return [f"{path}: {', '.join(named)} {verb} only for a replica found through 'dns'"]
    problems = [
        f"{path}: 'dns' cannot be combined with '{field}' (each address it resolves to is one attached runtime)"
        for field in ("device", "endpoint")
        if entry.get(field) is not None
    ]
    if entry.get("port") is None:
        problems.append(f"{path}: a replica found through 'dns' needs the runtimes' 'port'")
    if entry.get("model") is None:
        problems.append(f"{path}: a replica found through 'dns' names its runtimes' model with 'model'")
    return problems


def _outlier_problems(path: str, outlier: Any) -> list[str]:
    if not isinstance(outlier, dict):
        return []
    base, top = outlier.get("base_ejection_ms", 30_000), outlier.get("max_ejection_ms")
    if isinstance(base, int) and isinstance(top, int) and top < base:
        return [f"{path}.outlier_detection.max_ejection_ms: must be at least base_ejection_ms ({base}), got {top}"]
    return []
