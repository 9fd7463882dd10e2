"""Profiles (R-PROF): how far a model may trade the published answers for speed, under the names
the upstream runtime gives them.

A profile is three switches, each an approximation it allows:
- `coalesces` — rows of concurrent requests may share a forward of a model that is not
  batch-invariant (R-BAT-5's probe failed), so a row's answer may change with its company;
- `shares_context` — a decision model may run a multi-question request's state once (R-SC),
  whose answers agree with the unshared ones only up to rounding;
- `other_precision` — a precision other than the published one (`--dtype`, R-DT-2) may serve.

`exact` allows none of them: every answer is the one its row gets alone, in the published
precision (R-PROF-1). Any profile with a switch on is `approximate`. A model serves one profile
(R-PROF-3) and always answers `exact` too; a request may ask for either (R-PROF-4).

Pure: names and flags in, a `Profile` or a one-line refusal out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from vllm_srun.domain.errors import InvalidRequest, quoted

EXACT = "exact"
SHARED_CONTEXT = "shared_context"
BATCHING = "batching"
MAX_SPEED = "max_speed"
DEFAULT = EXACT


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    coalesces: bool
    shares_context: bool
    other_precision: bool
    description: str

    @property
    def numerics(self) -> Literal["exact", "approximate"]:
        """`exact` when the profile allows no approximation, else `approximate`."""
        return "approximate" if self.coalesces or self.shares_context or self.other_precision else "exact"

    def covers(self, other: Profile) -> bool:
        """Whether this profile allows every approximation OTHER allows."""
        return (
            (self.coalesces or not other.coalesces)
            and (self.shares_context or not other.shares_context)
            and (self.other_precision or not other.other_precision)
        )

    def card(self) -> dict[str, str]:
        """The card's `profiles` entry."""
        return {"name": self.name, "numerics": self.numerics, "description": self.description}


PROFILES: Mapping[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            EXACT,
            coalesces=False,
            shares_context=False,
            other_precision=False,
            description="every answer bit-identical to its row's answer alone, in the published precision",
        ),
        Profile(
            SHARED_CONTEXT,
            coalesces=False,
            shares_context=True,
            other_precision=False,
            description="exact, except that a decision model reads a multi-question request's state once",
        ),
        Profile(
            BATCHING,
            coalesces=True,
            shares_context=False,
            other_precision=False,
            description="rows of concurrent requests share forwards, also where that changes the last bits",
        ),
        Profile(
            MAX_SPEED,
            coalesces=True,
            shares_context=True,
            other_precision=True,
            description="batching and shared context, and a precision other than the published one (--dtype)",
        ),
    )
}
NAMES: tuple[str, ...] = tuple(PROFILES)


def named(name: str) -> Profile:
    """The profile called NAME; ValueError (one line) for any other name."""
    found = PROFILES.get(name)
    if found is None:
        raise ValueError(f"profile must be one of {', '.join(NAMES)} (got {name!r})")
    return found


def least_covering(*, shares_context: bool, other_precision: bool) -> Profile:
    """The first profile, in the order exact, shared_context, batching, max_speed, that allows
    what the settings ask: the profile of a model whose `profile` is unset (R-PROF-3)."""
    asked = Profile("", coalesces=False, shares_context=shares_context, other_precision=other_precision, description="")
    return next(p for p in PROFILES.values() if p.covers(asked))


def serving_profile(asked: str | None, enable_shared_context: bool | None, *, other_precision: bool = False) -> Profile:
    """The profile a model serves (R-PROF-3): ASKED (`profile`; None: unset), or when unset the
    least profile that allows what the other settings ask: `--enable-shared-context` a shared
    context, a precision other than the published one (OTHER_PRECISION) another precision. A
    setting that contradicts a named profile is refused in one line (ValueError):
    `--enable-shared-context` with a profile that never shares, `--no-enable-shared-context` with
    one that does, another precision with any profile but max_speed."""
    if asked is None:
        return least_covering(shares_context=enable_shared_context is True, other_precision=other_precision)
    profile = named(asked)
    if enable_shared_context is True and not profile.shares_context:
        raise ValueError(
            f"--enable-shared-context contradicts profile {asked}, which never shares a decision model's context "
            f"(use profile {SHARED_CONTEXT} or {MAX_SPEED})"
        )
    if enable_shared_context is False and profile.shares_context:
        raise ValueError(
            f"--no-enable-shared-context contradicts profile {asked}, which shares a decision model's context "
            f"(use profile {EXACT} or {BATCHING})"
        )
    if other_precision and not profile.other_precision:
        raise ValueError(
            f"profile {asked} serves the published precision only; another --dtype needs profile {MAX_SPEED}"
        )
    return profile


def never_coalesces(asked: str | None, enable_shared_context: bool | None) -> bool:
    """Whether the profile these settings ask for keeps rows of concurrent requests apart on a model
    that is not batch-invariant (exact, shared_context): the engine is then asked for its
    batch-invariant kernels where it has them, so that rows still merge (R-PROF-1). A precision
    other than the published one settles as max_speed, which coalesces; that is known after the
    load, and the kernels asked for here only cost a little speed there."""
    try:
        return not serving_profile(asked, enable_shared_context).coalesces
    except ValueError:
        return False  # a contradiction: the load refuses it in one line


def settings_refusal(
    profile: str | None, enable_shared_context: bool | None, dtype: str | None = None, device: str | None = None
) -> str | None:
    """Why these settings of one model contradict each other (one line), or None: a shared-context
    switch against a named profile (`serving_profile`), or, on a CPU (where every family's
    published precision computes in FP32, R-DT-1), a half precision with a named profile other
    than max_speed. Elsewhere the published precision is known only to the family: the load
    checks it (`serving_profile` with `other_precision`)."""
    try:
        serving_profile(profile, enable_shared_context)
    except ValueError as exc:
        return str(exc)
    on_cpu = device is not None and device.split(":", 1)[0] == "cpu"
    if on_cpu and profile is not None and dtype in ("bfloat16", "float16") and not named(profile).other_precision:
        return f"profile {profile} serves the published precision only (float32 on a CPU); --dtype {dtype} needs profile {MAX_SPEED}"
    return None


def precision_is_published(asked_dtype: str, resolved: str, published: str) -> bool:
    """Whether a model computes in its published precision: `--dtype auto`, or a dtype that
    resolves to what auto would (R-DT-2: a value equal to auto's is auto)."""
    return asked_dtype == "auto" or resolved == published


def enabled(serving: Profile, published: bool = True) -> tuple[Profile, ...]:
    """The profiles a model answers (R-PROF-4): exact, first, and its serving profile. Exact only
    where the model computes in its published precision (PUBLISHED): one that holds its weights in
    another (max_speed with `--dtype`) has nothing to answer exactly with."""
    exact = PROFILES[EXACT]
    if serving.name == EXACT:
        return (exact,)
    return (exact, serving) if published else (serving,)


def profile_for(asked: str | None, serving: Profile, published: bool = True) -> Profile:
    """A request's profile (`options.profile`; None: the serving one), or 400 `invalid_request`
    naming the enabled ones when the model does not answer ASKED (R-PROF-4)."""
    if asked is None:
        return serving
    answered = enabled(serving, published)
    for profile in answered:
        if profile.name == asked:
            return profile
    names = ", ".join(p.name for p in answered)
    why = "" if asked != EXACT else " (it computes in another precision than the published one)"
    raise InvalidRequest(f"options.profile {quoted(asked)} is not enabled for this model{why} (enabled: {names})")


def runs_alone(profile: Profile, batch_invariant: bool) -> bool:
    """R-PROF-2: whether a request's rows each run in a forward of their own — under a profile
    that does not coalesce, on a model whose answers depend on their company. A batch-invariant
    model's rows merge under every profile: their answers are the same bits either way."""
    return not profile.coalesces and not batch_invariant


def answer_numerics(profile: Profile, batch_invariant: bool, deterministic: bool) -> str:
    """What one answer promises (`meta.numerics`): `deterministic` under `--deterministic`;
    `exact` under an exact profile, or under batching on a batch-invariant model (merging changes
    no bit there); `approximate` otherwise."""
    if deterministic:
        return "deterministic"
    if profile.numerics == "exact" or (batch_invariant and not profile.shares_context and not profile.other_precision):
        return "exact"
    return "approximate"
