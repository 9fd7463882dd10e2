"""Is a replica's card compatible with its deployment (R-REP-2)?

All replicas of a deployment share artifact (by weights hash, the card's `model_sha256`), revision,
profile, engine arguments and capabilities; a deployment's `profile` is pinned like its revision. The exception is a batch limit the deployment leaves unset: each worker resolves
(on GPUs, calibrates) its own, so those may differ. A limit the deployment sets is pinned:
a replica reporting another value is `incompatible` and never dispatched to.

The reference is the card of the deployment's first replica that became ready.
"""

from __future__ import annotations

from typing import Any

from vllm_srun.adapters.config.schema import DeploymentConfig
from vllm_srun.adapters.hub import COMMIT

BATCH_LIMITS = ("max_num_seqs", "max_num_batched_tokens")
SHARED_CARD_FIELDS = ("model_sha256", "revision", "family", "surfaces", "dtype", "profile")
SHARED_ENGINE_ARGS = ("batch_window_ms", "dtype", "enable_shared_context", "max_model_len")
SHARED_LIMITS = ("max_input_tokens",)


def card_problem(card: dict[str, Any], deployment: DeploymentConfig, reference: dict[str, Any] | None) -> str | None:
    """Why this card may not serve the deployment, or None when it may."""
    args = card.get("engine_args") or {}
    pinned = {"max_num_seqs": deployment.max_num_seqs, "max_num_batched_tokens": deployment.max_num_batched_tokens}
    for name in BATCH_LIMITS:
        wanted = pinned[name]
        if wanted is not None and args.get(name) != wanted:
            return f"reports {name} {args.get(name)} but the deployment sets {wanted}"
    # a 40-hex commit is pinned; a branch or tag resolves to a commit the card reports (R-PKG-5)
    pinned_commit = deployment.revision is not None and COMMIT.fullmatch(deployment.revision) is not None
    if pinned_commit and card.get("revision") not in (None, deployment.revision):
        return f"serves revision {card.get('revision')} but the deployment pins {deployment.revision}"
    if deployment.profile is not None and card.get("profile") not in (None, deployment.profile):
        return f"serves profile {card.get('profile')} but the deployment asks for {deployment.profile}"  # R-PROF-3
    if reference is None:
        return None
    for name in SHARED_CARD_FIELDS:
        if card.get(name) != reference.get(name):
            return f"{name} {card.get(name)!r} differs from the pool's {reference.get(name)!r}"
    ref_args = reference.get("engine_args") or {}
    for name in SHARED_ENGINE_ARGS:
        if args.get(name) != ref_args.get(name):
            return f"engine_args.{name} {args.get(name)!r} differs from the pool's {ref_args.get(name)!r}"
    limits, ref_limits = card.get("limits") or {}, reference.get("limits") or {}
    for name in SHARED_LIMITS:
        if limits.get(name) != ref_limits.get(name):
            return f"limits.{name} {limits.get(name)!r} differs from the pool's {ref_limits.get(name)!r}"
    return None


def pick_card(cards: list[dict[str, Any]], model: str | None) -> dict[str, Any] | None:
    """The card of the model a replica serves for the deployment: the one named `model`
    (an attached runtime), else the only one."""
    if model is not None:
        return next((card for card in cards if card.get("id") == model), None)
    return cards[0] if len(cards) == 1 else None


def calibrated_limits(card: dict[str, Any] | None) -> dict[str, Any]:
    """The batch limits a replica reports, with where each came from (inventory)."""
    args = (card or {}).get("engine_args") or {}
    return {
        key: args.get(key)
        for key in (
            "max_num_seqs",
            "max_num_seqs_source",
            "max_num_batched_tokens",
            "max_num_batched_tokens_source",
        )
        if key in args
    }
