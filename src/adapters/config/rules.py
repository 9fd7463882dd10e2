"""Config rules that relate fields to each other (R-REP-1, R-REP-2, R-ARG-2, R-LEN).

They run on the parsed YAML (plain dicts and lists) after `loader.py` has reported what the
types refuse, so they look only at values of the right shape and report one line per problem.
"""

from __future__ import annotations

import re
from typing import Any

from .schema import DEPLOYMENT_NAME_PATTERN


def relation_problems(data: dict[Any, Any]) -> list[str]:
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
    for name, deployment in deployments.items():
        path = f"deployments.{name}"
        if not isinstance(name, str) or not re.match(DEPLOYMENT_NAME_PATTERN, name):
            problems.append(
                f"{path}: a deployment name is letters, digits, '.', '_' or '-', starting with a letter or digit"
            )
        if isinstance(deployment, dict):
            problems.extend(deployment_problems(path, deployment))
    system = data.get("system")
    decision = system.get("decision_model") if isinstance(system, dict) else None
    target = decision.get("deployment") if isinstance(decision, dict) else None
    if isinstance(target, str) and target not in deployments:
        known = ", ".join(map(str, deployments)) or "none are configured"
        problems.append(f"system.decision_model.deployment: no deployment named '{target}' ({known})")
    return problems


def deployment_problems(path: str, d: dict[str, Any]) -> list[str]:
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
    seen: set[tuple[Any, Any]] = set()
    for index, replica in enumerate(listed):
        if not isinstance(replica, dict):
            continue
        where = f"{path}.replicas[{index}]"
        problems.extend(_placement_problems(where, replica, "an attached replica"))
        if replica.get("device") is None and replica.get("endpoint") is None:
            problems.append(f"{where}: needs 'device' (a managed worker) or 'endpoint' (an attached runtime)")
        key = (replica.get("endpoint"), replica.get("model"))
        if key[0] is not None and key in seen:
            problems.append(f"{where}: the same endpoint and model are listed twice")
        seen.add(key)
    attached = d.get("endpoint") is not None or any(r.get("endpoint") for r in entries)
    if attached and d.get("max_model_len") is not None:
        problems.append(
            f"{path}.max_model_len: refused on a deployment with an attached endpoint; "
            "pass --max-model-len to the attached runtime itself"
        )
    devices = [d.get("device")] + [r.get("device") for r in entries]
    if d.get("dtype") == "float16" and "cpu" in devices:
        problems.append(f"{path}.dtype: float16 runs on GPUs only, and a worker is on the CPU")
    if d.get("engine") == "onnxruntime" and d.get("dtype") not in (None, "auto"):
        problems.append(f"{path}.dtype: the onnxruntime engine runs only dtype auto")
    problems.extend(_outlier_problems(path, d.get("outlier_detection")))
    return problems


def _placement_problems(path: str, entry: dict[str, Any], what: str) -> list[str]:
    problems = []
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


def _outlier_problems(path: str, outlier: Any) -> list[str]:
    if not isinstance(outlier, dict):
        return []
    base, top = outlier.get("base_ejection_ms", 30_000), outlier.get("max_ejection_ms")
    if isinstance(base, int) and isinstance(top, int) and top < base:
        return [f"{path}.outlier_detection.max_ejection_ms: must be at least base_ejection_ms ({base}), got {top}"]
    return []
