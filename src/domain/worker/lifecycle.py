"""The life of a served model, decided without touching one (R-API-6, R-BAT-5, R-API-9).

- **States**: a model starts `starting`, is `loading` (package resolved, loaded on its device),
  then `warming` (warm-up, the batch-invariance probe, the golden check), then `ready`; any
  step may end it `failed`, which is final (nothing unloads). A transient failure before the
  model has served anything (R-LOAD-1: not the golden check) takes it back from `warming` to
  `loading` for another attempt (`load_retries.py`).
- **Determinism**: with `--deterministic`, the engine's declared method and the load-time probe
  decide how answers stay bit-identical: merged forwards (`batch_invariant`), one row per
  forward (`rows_alone`), or refused (the engine declares no method, or one we do not know).
- **Health**: what `/health` reports from the models' states.
- **Names**: which served thing a request's `model` names: its served name, an alias (the
  artifact, its folder), nothing when only one is served, or a name a caller implies (the
  typesafe-sdk's default). The worker (`Runtime.get`) and the front (`Fleet.resolve`) share it.

Pure: states are values, names are strings; the callers hold the models.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field


class ModelState(enum.StrEnum):
    """Where a served model is in its life (the card's and `/health`'s `status`)."""

    STARTING = "starting"  # listed, not begun
    LOADING = "loading"  # resolving its package, loading it on its device
    WARMING = "warming"  # warm-up, probe, golden check: only the golden check's requests run
    READY = "ready"  # serves requests
    FAILED = "failed"  # final: the card and /health say why

    @property
    def final(self) -> bool:
        return self in (ModelState.READY, ModelState.FAILED)


# the steps a model may take; READY and FAILED go nowhere (no unloading today); WARMING back to
# LOADING is another load attempt (R-LOAD-1)
TRANSITIONS: Mapping[ModelState, frozenset[ModelState]] = {
    ModelState.STARTING: frozenset({ModelState.LOADING, ModelState.FAILED}),
    ModelState.LOADING: frozenset({ModelState.WARMING, ModelState.FAILED}),
    ModelState.WARMING: frozenset({ModelState.READY, ModelState.FAILED, ModelState.LOADING}),
    ModelState.READY: frozenset(),
    ModelState.FAILED: frozenset(),
}

# the states a model passes through before it is ready, in order (what /health reports first)
ON_THE_WAY = (ModelState.STARTING, ModelState.LOADING, ModelState.WARMING)


class IllegalTransition(ValueError):
    """A step the lifecycle does not allow (a bug in the loader, not a client's error)."""


def advance(state: ModelState, to: ModelState) -> ModelState:
    """TO, when a model in STATE may go there; IllegalTransition otherwise."""
    if to not in TRANSITIONS[state]:
        raise IllegalTransition(f"a model {state} cannot become {to}")
    return to


# ---- health ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Health:
    ready: bool  # every model serves (HTTP 200)
    status: str  # ready | failed | starting | loading | warming | degraded


def health(states: Iterable[ModelState]) -> Health:
    """The worker's health from its models' states: ready when all are; failed when all failed;
    the first model still on its way names the status while any is; degraded otherwise (some
    ready, some failed). No model at all is ready (nothing waits)."""
    listed = list(states)
    if all(state is ModelState.READY for state in listed):
        return Health(True, ModelState.READY.value)
    if all(state is ModelState.FAILED for state in listed):
        return Health(False, ModelState.FAILED.value)
    waiting = next((state for state in listed if state in ON_THE_WAY), None)
    return Health(False, waiting.value if waiting is not None else "degraded")


# ---- determinism ----------------------------------------------------------------------------


class Determinism(enum.StrEnum):
    """How `--deterministic` is honoured (the card's `deterministic.method`)."""

    BATCH_INVARIANT = "batch_invariant"  # a row gets the same bits in any forward it shares, at any size
    ROWS_ALONE = "rows_alone"  # only a row run alone is reproducible: one row per forward


def decide_determinism(engine: str, declared: str | None, batch_invariant: bool) -> Determinism:
    """How a model loaded with `--deterministic` keeps its answers bit-identical: the engine's
    DECLARED method, downgraded to one row per forward when the load-time probe did not find the
    model BATCH_INVARIANT. ValueError (the model fails to load, with this reason) when the engine
    declares none or one we do not know."""
    if declared is None:
        raise ValueError(f"--deterministic: the {engine} engine cannot answer bit-identically in any batch")
    try:
        method = Determinism(declared)
    except ValueError:
        known = ", ".join(Determinism)
        raise ValueError(
            f"--deterministic: the {engine} engine declares determinism {declared!r} (known: {known})"
        ) from None
    if method is Determinism.BATCH_INVARIANT and not batch_invariant:
        return Determinism.ROWS_ALONE  # the probe found rows that differ inside a batch
    return method


# ---- names ----------------------------------------------------------------------------------


class Unresolved(enum.Enum):
    UNNAMED = "unnamed"  # no name given and several are served
    UNKNOWN = "unknown"  # the name names nothing served


@dataclass(frozen=True, slots=True)
class NameTable:
    """The names a request's `model` may use: the served names (in order) and aliases (another
    name → the served one; None: more than one served thing has it, so it names none)."""

    served: tuple[str, ...]
    aliases: Mapping[str, str | None] = field(default_factory=dict)

    def resolve(self, name: str | None, implied: Callable[[str], str | None] | None = None) -> str | Unresolved:
        """The served name NAME means. No name: the only one served. A name no table entry has
        may still be IMPLIED (a caller's rule, e.g. the typesafe-sdk's default name)."""
        if name is None:
            return self.served[0] if len(self.served) == 1 else Unresolved.UNNAMED
        if name in self.served:
            return name
        alias = self.aliases.get(name)
        if alias is not None:
            return alias
        if implied is not None:
            meant = implied(name)
            if meant is not None and meant in self.served:
                return meant
        return Unresolved.UNKNOWN


def name_table(entries: Sequence[tuple[str, Iterable[str]]], *, first_wins: bool) -> NameTable:
    """The table of ENTRIES (served name, its other names), in order. An alias that is also a
    served name is that name's; an alias two entries share names the first one (FIRST_WINS) or
    none."""
    served = tuple(name for name, _ in entries)
    if len(set(served)) != len(served):
        raise ValueError(f"a served name is given twice: {', '.join(served)}")
    aliases: dict[str, str | None] = {}
    for name, others in entries:
        for alias in dict.fromkeys(others):
            if not alias or alias in served:
                continue
            if alias not in aliases:
                aliases[alias] = name
            elif not first_wins and aliases[alias] != name:
                aliases[alias] = None
    return NameTable(served, aliases)


def sole(names: Iterable[str]) -> str | None:
    """The one name of NAMES, or None when there are none or several."""
    found = list(names)
    return found[0] if len(found) == 1 else None
