"""Refusals that need to look at the packages, before any model loads (R-ARG-2, R-LEN-1, R-SC-2).

`--max-model-len` applies to decision models only and may not exceed a package's own limit;
`--enable-shared-context` / `--no-enable-shared-context` apply to decision models only (encoders
have no shared-context path). Each check reads `config.json` / `srun.json`, never the weights.
A model that cannot be resolved is left to the load, which reports it in the card.
"""

from __future__ import annotations

from typing import Callable, Sequence

from vllm_srun.domain.engine_args import EngineArgs

DECISION = "decision"


def _family_and_limit(artifact: str, progress: Callable[[str], None]) -> tuple[str, int | None] | None:
    from vllm_srun.adapters import model_store
    from vllm_srun.adapters.families.decision import package_limit
    from vllm_srun.adapters.families.registry import family_for
    from vllm_srun.domain.errors import DomainError

    try:
        folder = model_store.resolve(artifact, progress=progress)
        family = family_for(folder).name
    except (DomainError, OSError, ValueError):
        return None
    return family, (package_limit(folder) if family == DECISION else None)


def engine_arg_refusal(models: Sequence[str], args: EngineArgs, progress: Callable[[str], None]) -> str | None:
    """One line saying why these engine args cannot serve these models, or None."""
    if args.max_model_len is None and args.enable_shared_context is None:
        return None
    for artifact in models:
        found = _family_and_limit(artifact, progress)
        if found is None:
            continue
        family, limit = found
        if family != DECISION:
            if args.max_model_len is not None:
                return f"--max-model-len applies to decision models only; {artifact} is a {family} model"
            flag = "--enable-shared-context" if args.enable_shared_context else "--no-enable-shared-context"
            return f"{flag} applies to decision models only; {artifact} is a {family} model (no shared-context path)"
        if args.max_model_len is not None and limit is not None and args.max_model_len > limit:
            return f"--max-model-len {args.max_model_len} is above the limit of {artifact} ({limit} input tokens)"
    return None
