"""The documents the front reports: inventory (R-REP-4), the deployments' cards (R-API-6) and
health (R-API-7); and which deployment a request's `model` names, with a refusal that says why
(an artifact name two deployments serve names neither: 400 naming them)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from vllm_srun.adapters.front.fleet import Deployment, Fleet
from vllm_srun.adapters.schemas.common import API_VERSION
from vllm_srun.domain.errors import InvalidRequest, ModelNotFound, quoted
from vllm_srun.domain.settings import bounds


def deployment_for(fleet: Fleet, model: str | None) -> Deployment:
    """The deployment MODEL names (`Fleet.resolve`). A name several deployments serve (their
    artifact, whole or its last part) names none of them: 400 saying so and naming them."""
    try:
        return fleet.resolve(model)
    except ModelNotFound:
        sharing = [name for name, spec in fleet.config.deployments.items() if model in _artifact_names(spec.artifact)]
        if model is None or len(sharing) < 2:
            raise
        raise InvalidRequest(
            f"model {quoted(model)} is ambiguous: deployments {', '.join(sharing)} all serve it; "
            f"name one of them in `model`"
        ) from None


def _artifact_names(artifact: str | None) -> tuple[str, ...]:
    return (artifact, Path(artifact).name) if artifact else ()


# card fields that describe one worker, not the deployment
_WORKER_ONLY = ("created", "device", "status", "reason", "ready", "artifact")


def inventory(
    fleet: Fleet, now: float, *, draining: bool = False, reload: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "pid": os.getpid(),  # `vllm-sr reload` checks it against the pid file before it signals
        "draining": draining,
        "deployments": [_deployment_inventory(d, now) for d in fleet.deployments.values()],
        # retired workers still finishing the requests they hold (R-REP-2)
        "retiring": [
            {"id": s.handle.id, "in_flight": s.handle.record.in_flight, **s.handle.describe()}
            for s in fleet.retiring.values()
        ],
        "reload": reload,
    }


def _deployment_inventory(deployment: Deployment, now: float) -> dict[str, Any]:
    policy = deployment.pool.policy.settings
    workers = []
    for status in deployment.pool.inventory(now):
        row = dataclasses.asdict(status)
        row["state"] = status.state.value
        row["ejected_for_s"] = round(status.ejected_for_s, 3)
        handle = deployment.handles[status.id]
        row.update(handle.describe())
        if row["reason"] is None and not status.ready:  # not up yet: why its probes fail, if they do
            row["reason"] = handle.last_probe_error
        workers.append(row)
    return {
        "name": deployment.name,
        "artifact": deployment.config.artifact,
        "desired": len(deployment.handles),
        "ready": deployment.ready_count(),
        "max_in_flight_per_worker": deployment.pool.max_in_flight,
        "timeout_ms": deployment.config.timeout_ms or bounds.TIMEOUT_MS.default,
        "outlier_detection": {
            "consecutive_timeouts": policy.consecutive_timeouts,
            "base_ejection_ms": policy.base_ejection_ms,
            "max_ejection_ms": policy.effective_max_ejection_ms,
            "max_ejection_percent": policy.max_ejection_percent,
        },
        "front_result_cache": (
            {"entries": deployment.cache.capacity, "stored": len(deployment.cache)}
            if deployment.cache is not None
            else None
        ),
        "workers": workers,
    }


def deployment_card(deployment: Deployment) -> dict[str, Any]:
    """The deployment's card: its reference replica's card under the deployment's name."""
    ready = deployment.ready_count()
    card: dict[str, Any] = {"object": "model", "owned_by": "vllm-srun"}
    if deployment.reference_card is not None:
        card.update({k: v for k, v in deployment.reference_card.items() if k not in _WORKER_ONLY})
    card.update(
        {
            "id": deployment.name,
            "artifact": deployment.config.artifact,
            "status": "ready" if ready else "starting",
            "ready": ready > 0,
            "replicas": {"desired": len(deployment.handles), "ready": ready},
        }
    )
    return card


def health(fleet: Fleet, *, draining: bool) -> tuple[bool, dict[str, Any]]:
    """200 only when every deployment has a ready replica and the front is not draining; each
    replica not ready is listed with its state and why (its failure, or its last probe's error)."""
    deployments = {
        name: {
            "status": "ready" if d.ready_count() else "not_ready",
            "ready": d.ready_count(),
            "desired": len(d.handles),
            "not_ready": _not_ready(d),
        }
        for name, d in fleet.deployments.items()
    }
    ready = not draining and all(d.ready_count() > 0 for d in fleet.deployments.values())
    status = "draining" if draining else ("ready" if ready else "not_ready")
    return ready, {"api_version": API_VERSION, "status": status, "deployments": deployments}


def _not_ready(deployment: Deployment) -> list[dict[str, Any]]:
    """Each replica of DEPLOYMENT that takes no request: its id, state and reason."""
    out = []
    for replica in deployment.pool:
        if replica.up:
            continue
        handle = deployment.handles.get(replica.id)
        reason = replica.failed_reason or replica.incompatible_reason
        if reason is None and handle is not None:
            reason = handle.last_probe_error
        state = "failed" if replica.failed_reason else "incompatible" if replica.incompatible_reason else "starting"
        out.append({"id": replica.id, "state": state, "reason": reason})
    return out
