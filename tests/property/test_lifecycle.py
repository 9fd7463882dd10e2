"""`domain/worker/lifecycle`: a served model's states and steps, /health from them, the determinism
decision, and the name resolution the worker and the front share."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vllm_srun.domain.worker.lifecycle import (
    TRANSITIONS,
    Determinism,
    IllegalTransition,
    ModelState,
    Unresolved,
    advance,
    decide_determinism,
    health,
    name_table,
)

STATES = st.sampled_from(list(ModelState))
NAMES = st.sampled_from(["a", "b", "c", "m", "org/m", "x"])


@given(steps=st.lists(STATES, max_size=8))
def test_a_model_walks_forward_only_and_failed_and_ready_are_final(steps: list[ModelState]) -> None:
    state = ModelState.STARTING
    seen = [state]
    for to in steps:
        try:
            state = advance(state, to)
        except IllegalTransition:
            assert to not in TRANSITIONS[state]
            continue
        seen.append(state)
    order = list(ModelState)  # declared in the order a model lives them; FAILED may follow any
    on_the_way = [s for s in seen if s is not ModelState.FAILED]
    # the one step back: warming to loading, another load attempt (R-LOAD-1); between two such
    # steps a model walks forward only
    attempts: list[list[ModelState]] = [[]]
    for before, state_now in zip([None, *on_the_way], on_the_way):
        if before is ModelState.WARMING and state_now is ModelState.LOADING:
            attempts.append([])
        attempts[-1].append(state_now)
    for attempt in attempts:
        assert attempt == sorted(attempt, key=order.index) and len(set(attempt)) == len(attempt)
    assert ModelState.READY not in [s for attempt in attempts[:-1] for s in attempt]
    assert seen.count(ModelState.FAILED) <= 1 and seen.count(ModelState.READY) <= 1
    if state.final:
        for to in ModelState:
            with pytest.raises(IllegalTransition):
                advance(state, to)


def test_the_steps_of_a_load() -> None:
    state = ModelState.STARTING
    for to in (ModelState.LOADING, ModelState.WARMING, ModelState.READY):
        state = advance(state, to)
    assert state is ModelState.READY
    assert advance(ModelState.WARMING, ModelState.FAILED) is ModelState.FAILED  # the golden check failed
    assert advance(ModelState.WARMING, ModelState.LOADING) is ModelState.LOADING  # a transient failure: again
    with pytest.raises(IllegalTransition, match="a model starting cannot become ready"):
        advance(ModelState.STARTING, ModelState.READY)


@given(states=st.lists(STATES, max_size=6))
def test_health_is_ready_only_when_every_model_is(states: list[ModelState]) -> None:
    got = health(states)
    assert got.ready == all(s is ModelState.READY for s in states)
    if got.ready:
        assert got.status == "ready"
    elif all(s is ModelState.FAILED for s in states):
        assert got.status == "failed"
    elif waiting := [s for s in states if s in (ModelState.STARTING, ModelState.LOADING, ModelState.WARMING)]:
        assert got.status == waiting[0]  # the first model on its way names it
    else:
        assert got.status == "degraded" and ModelState.READY in states and ModelState.FAILED in states


def test_health_examples() -> None:
    assert health([]) == health([ModelState.READY])
    assert health([ModelState.READY, ModelState.FAILED]).status == "degraded"
    assert health([ModelState.READY, ModelState.WARMING, ModelState.LOADING]).status == "warming"


@given(declared=st.sampled_from([None, "batch_invariant", "rows_alone", "bitwise"]), invariant=st.booleans())
def test_determinism_follows_the_engine_and_the_probe(declared: str | None, invariant: bool) -> None:
    if declared not in ("batch_invariant", "rows_alone"):
        with pytest.raises(ValueError, match=r"^--deterministic: the e engine"):
            decide_determinism("e", declared, invariant)
        return
    method = decide_determinism("e", declared, invariant)
    # merged forwards only where the engine promises it and the probe agrees
    assert (method is Determinism.BATCH_INVARIANT) == (declared == "batch_invariant" and invariant)


def test_determinism_refusals_name_the_engine() -> None:
    with pytest.raises(ValueError, match="the onnxruntime engine cannot answer bit-identically in any batch"):
        decide_determinism("onnxruntime", None, True)
    with pytest.raises(ValueError, match=r"declares determinism 'bitwise' \(known: batch_invariant, rows_alone\)"):
        decide_determinism("acme", "bitwise", True)


ENTRIES = st.lists(st.tuples(NAMES, st.lists(NAMES, max_size=3)), max_size=4, unique_by=lambda entry: entry[0])


@given(entries=ENTRIES, name=st.none() | NAMES, first_wins=st.booleans(), implied=st.none() | NAMES)
def test_a_name_resolves_to_a_served_one_by_the_rules(
    entries: list[tuple[str, list[str]]], name: str | None, first_wins: bool, implied: str | None
) -> None:
    table = name_table(entries, first_wins=first_wins)
    served = [n for n, _ in entries]
    got = table.resolve(name, lambda asked: implied)
    if name is None:
        assert got == (served[0] if len(served) == 1 else Unresolved.UNNAMED)
        return
    if name in served:
        assert got == name  # a served name always names itself
        return
    having = [n for n, others in entries if name in others]
    if having and (first_wins or len(having) == 1):
        assert got == having[0]
    elif implied in served:
        assert got == implied
    else:
        assert got is Unresolved.UNKNOWN


@given(entries=ENTRIES, name=NAMES)
def test_resolution_only_ever_names_what_is_served(entries: list[tuple[str, list[str]]], name: str) -> None:
    for first_wins in (True, False):
        got = name_table(entries, first_wins=first_wins).resolve(name, lambda asked: "not-served")
        assert got is Unresolved.UNKNOWN or got in [n for n, _ in entries]


def test_name_examples() -> None:
    worker = name_table([("m", ("org/m", "m")), ("n", ("org/m", "n-folder"))], first_wins=True)
    assert worker.resolve("org/m") == "m" and worker.resolve("n-folder") == "n"
    front = name_table([("a", ("org/m", "m")), ("b", ("org/m", "m"))], first_wins=False)
    assert front.resolve("org/m") is Unresolved.UNKNOWN and front.resolve(None) is Unresolved.UNNAMED
    assert front.resolve("sdk-default", lambda asked: "b") == "b"
    with pytest.raises(ValueError, match="given twice"):
        name_table([("a", ()), ("a", ())], first_wins=True)
