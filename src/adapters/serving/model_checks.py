"""What a models file entry (or a deployment) asks of a package, checked before its weights are
read: the family's options (`Family.options`), a profile that needs a path the family lacks
(R-PROF-3), and the memory budget (`memory_budget_gib`: the estimated resident size of the
weights at the precision the model computes in). Both the worker's preflight
(`app/server.check_worker`, one line and exit 2) and the load (`Loader._load`, the card's reason)
ask it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vllm_srun.adapters.contracts import Device, Family
from vllm_srun.adapters.serving.package_facts import parameter_count
from vllm_srun.domain.settings.dtypes import memory_refusal, resolve_dtype
from vllm_srun.domain.settings.engine_args import EngineArgs
from vllm_srun.domain.settings.profiles import named

SHARED_CONTEXT_ARG = "enable_shared_context"  # a family whose packages take it has a shared-context path


def package_refusal(
    folder: Path,
    family: Family,
    device: Device,
    args: EngineArgs,
    *,
    options: Mapping[str, Any],
    memory_budget_gib: float | None,
) -> str | None:
    """Why the package in FOLDER cannot be served by FAMILY on DEVICE with these settings (one
    line), or None."""
    unknown = sorted(set(options) - family.options)
    if unknown:
        takes = ", ".join(sorted(family.options)) or "none"
        return f"the {family.name} family has no option {', '.join(map(repr, unknown))} (its options: {takes})"
    # shared_context adds only a shared context to exact: a family without the path cannot serve it
    # (max_speed adds batching and precision too, so it serves on any family)
    sharing_only = args.profile is not None and named(args.profile).shares_context and args.profile != "max_speed"
    if sharing_only and SHARED_CONTEXT_ARG not in family.describe(folder).engine_args:
        return (
            f"profile {args.profile} applies to decision models only (a shared-context path); "
            f"this is {_with_article(family.name)} model"
        )
    if memory_budget_gib is not None:
        dtype = resolve_dtype(args.dtype, family.name, device.name, device.native_dtypes)
        return memory_refusal(parameter_count(folder), dtype, memory_budget_gib)
    return None


def _with_article(word: str) -> str:
    return f"an {word}" if word[:1].lower() in "aeiou" else f"a {word}"
