"""A served model as the wire shows it: its card (`GET /v1/models`, R-API-6) and the `meta` of an
answer (`options.return_meta`, R-API-8). The serving core keeps the state they read
(`serving/served.py`, `serving/model_setup.py`, `serving/package_facts.py`); the wire shapes are
built here, so the core never imports the schemas."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from vllm_srun.adapters.schemas.common import MAX_INPUTS, ResponseMeta
from vllm_srun.adapters.serving.scheduler_loop import ForwardStats
from vllm_srun.adapters.serving.served import ServedModel
from vllm_srun.domain.settings.profiles import Profile, answer_numerics

# the accelerators the project's own test suite runs every model on (the card's `accelerator_validated`)
VALIDATED_ACCELERATORS = frozenset({"cpu"})


def package_date(folder: Path) -> str:
    """The package's date (its config.json's, UTC, YYYY-MM-DD): the `release_date` clients list."""
    try:
        stamp = (folder / "config.json").stat().st_mtime
    except OSError:
        return ""
    return datetime.fromtimestamp(stamp, tz=UTC).date().isoformat()


def answer_meta(
    served: ServedModel, stats: ForwardStats | None, rows: int, profile: Profile | None = None
) -> ResponseMeta:
    """`meta` of an answer (R-API-8); no stats: answered from the result cache. PROFILE (None:
    the serving one): the profile it was computed under, and what that promises (`numerics`)."""
    model, serving = served.model, served.serving
    assert model is not None and serving is not None
    profile = profile or served.profile
    numerics = answer_numerics(profile, serving.batch_invariant, serving.determinism is not None)
    facts = served.facts
    forward_ms = round(stats.forward_s * 1000, 3) if stats is not None else 0.0
    return ResponseMeta(
        numerics=numerics,
        dtype=model.dtype,
        device=model.device.name,
        engine=model.engine.name,
        queue_ms=round(stats.queue_s * 1000, 3) if stats is not None else 0.0,
        forward_ms=forward_ms,
        forwards=stats.forwards if stats is not None else 0,
        rows=rows if stats is not None else 0,
        padded_tokens=stats.padded_tokens if stats is not None else 0,
        cache_hit=stats is None,
        model_id=served.name,
        revision=facts.revision if facts is not None else None,
        model_sha256=served.sha256,
        profile=profile.name,
        accelerator=model.device.kind,
        compute_ms=forward_ms,
    )


def model_card(served: ServedModel) -> dict[str, Any]:
    """SERVED's card (R-API-6): `GET /v1/models`' entry for it (`schemas/models_list.py` describes it)."""
    model, serving = served.model, served.serving
    limits = served.limits
    promise = serving if model is not None and serving is not None else None  # the probe's, once loaded
    facts = served.facts
    accelerator = served.accelerator
    card: dict[str, Any] = {
        "id": served.name,
        "object": "model",
        "owned_by": "vllm-srun",
        "artifact": served.artifact,
        "family": model.family if model else None,
        "surfaces": sorted(model.surfaces) if model else [],
        "repo": facts.repo if facts else None,
        "revision": facts.revision if facts else None,
        "model_sha256": served.sha256,
        "manifest_sha256": facts.manifest_sha256 if facts else None,
        "parameters": facts.parameters if facts else None,
        "licence": facts.licence if facts else None,
        "package_date": package_date(served.folder) if served.folder is not None else None,
        "dtype": model.dtype if model else served.args.dtype,
        "device": served.device,
        "accelerator": accelerator,
        "accelerator_validated": accelerator in VALIDATED_ACCELERATORS,
        "engine": model.engine.name if model else None,
        **served.profile_fields(),
        "numerics": promise.numerics if promise else None,
        # R-BAT-5: how many counted tokens a merged forward of an exact model may hold
        "merged_forward_tokens": model.invariant_tokens if model and promise and promise.batch_invariant else None,
        "engine_args": {
            "max_num_seqs": limits.max_num_seqs if limits else served.args.max_num_seqs,
            "max_num_seqs_source": limits.seqs_source if limits else None,
            "max_num_batched_tokens": limits.max_num_batched_tokens if limits else served.args.max_num_batched_tokens,
            "max_num_batched_tokens_source": limits.tokens_source if limits else None,
            "memory_class": limits.memory_class if limits else None,  # R-DEV-1: the row unset limits came from
            "calibration": served.serving.calibration if served.serving else None,  # R-DEV-2: GPU workers only
            "batch_window_ms": served.args.batch_window_ms,
            "dtype": served.args.dtype,
            # the value in force: a decision model's (family default on), False for families without the path
            "enable_shared_context": model.enable_shared_context if model else served.args.enable_shared_context,
            "max_model_len": served.args.max_model_len,
        },
        # the input budget (upstream's deployment `input`): most tokens an input may have (None: the
        # model's limit) and the overflow a request gets when it sets none
        "input": {"max_tokens": served.args.input_max_tokens, "overflow": served.args.input_overflow},
        "limits": {
            "max_input_tokens": model.max_input_tokens if model else None,
            "max_inputs": MAX_INPUTS,
            "max_request_tokens": served.max_request_tokens,
        },
        "caps": [
            {
                "lane": lane.name,
                "accounting": lane.accounting.value,
                "cap_tokens": lane.cap_tokens,
                "cap_seconds": lane.cap_seconds,
            }
            for lane in (model.lanes if model else ())
        ],
        "admission": (
            {
                "max_queue": served.admission.limits.max_queue,
                "max_queued_tokens": served.admission.limits.max_queued_tokens,
            }
            if served.admission is not None
            else None
        ),
        "golden": dict(served.golden),
        "plugins": list(served.serving.plugins) if served.serving else [],
        "status": served.status.value,
        "reason": served.reason,
        "ready": served.ready,
        "created": int(time.time()),
    }
    if served.serving is not None and served.serving.forwards is not None:
        card["threads"] = served.serving.forwards.card()
    if promise is not None and promise.determinism is not None:
        card["deterministic"] = {"method": promise.determinism}
    if model is not None:
        section = dict(model.card_section())
        card["limits"].update(section.pop("limits", None) or {})  # a family's own limits (options, levels, images)
        card.update(section)
        for head in card.get("heads") or ():  # how a request that sets no overflow reads a long input
            head["overflow"] = served.args.input_overflow
            if served.args.input_overflow == "window":  # one window as long as an input may be, no overlap
                most = min(served.args.input_max_tokens or model.max_input_tokens, model.max_input_tokens)
                head["window"] = {"tokens": most, "overlap": 0}
    if served.media is not None:
        card["media"] = {**card.get("media", {}), **served.media.card()}
    return card
