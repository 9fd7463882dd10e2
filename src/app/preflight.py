"""Refusals that need to look at the packages, before any model loads (R-ARG-2, R-LEN-1, R-SC-2).

Family-specific engine args (`--max-model-len`, `--enable-shared-context` /
`--no-enable-shared-context`) apply only to packages whose family takes them (decision models),
and `--max-model-len` may not exceed a package's own limit. Each check asks the package's family
to describe it (`Family.describe`: config and manifest, never the weights).

A model given as a path (absolute, `~`, `./`, `../`, or holding a `/`) that is not a folder (and
not a name in the model store) is refused here, naming the path; so is a name that is neither in
the model store nor in the built-in catalog. A Hugging Face id (`ORG/NAME[@REV]`, R-PKG-5) is
resolved here, from the cache or by a download with its progress, so that a missing, gated or
unreachable repository is refused in one line before anything listens. A built-in name is left
to the load, which may pull it and reports a failure in the card.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from vllm_srun.adapters.catalog import CATALOG
from vllm_srun.adapters.contracts import Device, ModelStore, PackageInfo, Progress
from vllm_srun.adapters.families.registry import FamilyRegistry
from vllm_srun.adapters.hub import parse_hub_id
from vllm_srun.adapters.serving.model_checks import package_refusal
from vllm_srun.adapters.serving.served import ServedModel
from vllm_srun.domain.errors import DomainError, ModelNotFound
from vllm_srun.domain.settings.engine_args import EngineArgs
from vllm_srun.domain.settings.profiles import settings_refusal


def looks_like_path(artifact: str) -> bool:
    """Whether a model argument is written as a filesystem path rather than a name."""
    return "/" in artifact or os.sep in artifact or artifact.startswith("~") or artifact in (".", "..")


def missing_path_refusal(artifact: str, store: ModelStore, progress: Progress = lambda _msg: None) -> str | None:
    """One line when ARTIFACT names no model here: a path that is no folder (nor a store entry), a
    name in neither the store nor the catalog, a Hub id that does not resolve (module doc)."""
    path = Path(artifact).expanduser()
    try:
        hub_id = not path.exists() and parse_hub_id(artifact) is not None
    except ModelNotFound as exc:
        return exc.message
    if hub_id:
        try:
            store.resolve(artifact, progress)
        except ModelNotFound as exc:
            return exc.message
        return None
    if not looks_like_path(artifact):
        if artifact in CATALOG:
            return None
        try:
            store.resolve(artifact, lambda _msg: None)
        except ModelNotFound as exc:
            return exc.message
        return None
    try:
        store.resolve(artifact, lambda _msg: None)
    except ModelNotFound:
        if path.exists():
            return f"the model path {artifact} is not a folder (a package folder in Hugging Face layout)"
        return f"the model path {artifact} does not exist"
    return None


def describe(artifact: str, store: ModelStore, families: FamilyRegistry, progress: Progress) -> PackageInfo | None:
    try:
        folder = store.resolve(artifact, progress)
        return families.family_for(folder).describe(folder)
    except (DomainError, OSError, ValueError):
        return None


def engine_arg_refusal(
    models: Sequence[str], args: EngineArgs, store: ModelStore, families: FamilyRegistry, progress: Progress
) -> str | None:
    """One line saying why these models (a path that is not a folder) or these engine args
    cannot be served, or None."""
    for artifact in models:
        refusal = missing_path_refusal(artifact, store, progress)
        if refusal:
            return refusal
    if args.max_model_len is None and args.enable_shared_context is None:
        return None
    for artifact in models:
        info = describe(artifact, store, families, progress)
        if info is None:
            continue
        if args.max_model_len is not None:
            if "max_model_len" not in info.engine_args:
                return (
                    f"--max-model-len applies to decision models only; {artifact} is {with_article(info.family)} model"
                )
            limit = info.max_input_tokens
            if limit is not None and args.max_model_len > limit:
                return f"--max-model-len {args.max_model_len} is above the limit of {artifact} ({limit} input tokens)"
        if args.enable_shared_context is not None and "enable_shared_context" not in info.engine_args:
            flag = "--enable-shared-context" if args.enable_shared_context else "--no-enable-shared-context"
            return f"{flag} applies to decision models only; {artifact} is {with_article(info.family)} model (no shared-context path)"
    return None


def model_refusal(
    served: ServedModel, device: Device, store: ModelStore, families: FamilyRegistry, progress: Progress
) -> str | None:
    """One line saying why a model's own settings cannot be served, or None: a profile its other
    settings contradict (R-PROF-3), a forced family that cannot read the package, an option its
    family does not have, a profile that needs a shared-context path, its memory budget
    (`serving/model_checks.py`). A package that cannot be found is left to the load."""
    args = served.args
    refusal = settings_refusal(args.profile, args.enable_shared_context, args.dtype, device.name)
    if refusal:
        return refusal
    asked = served.family or served.options or served.memory_budget_gib is not None or args.profile is not None
    if not asked:
        return None
    try:
        folder = store.resolve(served.target, progress)
    except (DomainError, OSError):
        return None
    try:
        family = families.family_for(folder, served.family)
    except DomainError as exc:
        return exc.message
    return package_refusal(
        folder, family, device, args, options=served.options, memory_budget_gib=served.memory_budget_gib
    )


def with_article(word: str) -> str:
    """WORD with its indefinite article ("an encoder", "a decision")."""
    return f"an {word}" if word[:1].lower() in "aeiou" else f"a {word}"
