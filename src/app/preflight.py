"""Refusals that need to look at the packages, before any model loads (R-ARG-2, R-LEN-1, R-SC-2).

Family-specific engine args (`--max-model-len`, `--enable-shared-context` /
`--no-enable-shared-context`) apply only to packages whose family takes them (decision models),
and `--max-model-len` may not exceed a package's own limit. Each check asks the package's family
to describe it (`Family.describe`: config and manifest, never the weights). A model that cannot
be resolved is left to the load, which reports it in the card.
"""

from __future__ import annotations

from collections.abc import Sequence

from vllm_srun.adapters.contracts import ModelStore, PackageInfo, Progress
from vllm_srun.adapters.families.registry import FamilyRegistry
from vllm_srun.domain.engine_args import EngineArgs
from vllm_srun.domain.errors import DomainError


def describe(artifact: str, store: ModelStore, families: FamilyRegistry, progress: Progress) -> PackageInfo | None:
    try:
        folder = store.resolve(artifact, progress)
        return families.family_for(folder).describe(folder)
    except (DomainError, OSError, ValueError):
        return None


def engine_arg_refusal(
    models: Sequence[str], args: EngineArgs, store: ModelStore, families: FamilyRegistry, progress: Progress
) -> str | None:
    """One line saying why these engine args cannot serve these models, or None."""
    if args.max_model_len is None and args.enable_shared_context is None:
        return None
    for artifact in models:
        info = describe(artifact, store, families, progress)
        if info is None:
            continue
        if args.max_model_len is not None:
            if "max_model_len" not in info.engine_args:
                return f"--max-model-len applies to decision models only; {artifact} is a {info.family} model"
            limit = info.max_input_tokens
            if limit is not None and args.max_model_len > limit:
                return f"--max-model-len {args.max_model_len} is above the limit of {artifact} ({limit} input tokens)"
        if args.enable_shared_context is not None and "enable_shared_context" not in info.engine_args:
            flag = "--enable-shared-context" if args.enable_shared_context else "--no-enable-shared-context"
            return (
                f"{flag} applies to decision models only; {artifact} is a {info.family} model (no shared-context path)"
            )
    return None
