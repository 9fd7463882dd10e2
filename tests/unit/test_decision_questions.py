"""Reading decision questions in their slots (R-API-5), the text each reads of its state (typed
parts, `over`), and the answers' confidence (R-API-4): pure functions, no model."""

from __future__ import annotations

import math
from typing import Any

import pytest

from vllm_srun.adapters.contracts import QuestionError
from vllm_srun.adapters.surfaces.decision_layout import confidence
from vllm_srun.adapters.surfaces.decision_questions import Label, ReadQuestion, read_all, read_question, sent_type
from vllm_srun.adapters.surfaces.decision_states import has_typed_parts, state_text, view_text


def invalid(question: Any) -> str:
    with pytest.raises(QuestionError) as info:
        read_question("q", question)
    assert info.value.code == "invalid_question"
    return info.value.message


# ------------------------------------------------------------------------------ ordered forms
def test_choices_levels_and_criteria_labels_read_as_their_criteria_forms() -> None:
    by_criteria = read_question("q", {"type": "choice", "criteria": {"a": None, "b": "bee"}})
    by_choices = read_question("q", {"type": "choice", "choices": [{"key": "a"}, {"key": "b", "description": "bee"}]})
    assert by_criteria.criteria == by_choices.criteria == {"a": None, "b": "bee"}
    assert list(by_choices.criteria) == ["a", "b"]  # order kept
    score = read_question("q", {"type": "score", "levels": ["low", {"x": 1}, ["hi"]]})
    assert score.criteria == ["low", {"x": 1}, ["hi"]]
    noul = read_question("q", {"type": "noul", "instructions": "ok?", "choices": [{"key": "true", "description": "y"}]})
    assert noul.criteria == {"true": "y", "false": None}
    for form in ({"labels": ["a", {"key": "b", "description": "bee"}]}, {"criteria": {"a": None, "b": "bee"}}):
        q = read_question("q", {"type": "set", **form})
        assert q.labels == (Label("a"), Label("b", "bee")) and q.threshold == 0.5


@pytest.mark.parametrize(
    "question, needle",
    [
        ({"type": "choice", "criteria": {"a": None, "b": None}, "choices": [{"key": "a"}, {"key": "b"}]}, "not both"),
        ({"type": "score", "criteria": ["a", "b"], "levels": ["a", "b"]}, "not both"),
        ({"type": "set", "criteria": {"a": None}, "labels": ["a"]}, "not both"),
        ({"type": "noul", "choices": [{"key": "maybe"}]}, "choices[0].key must be one of false, true"),
        ({"type": "choice", "choices": [{"key": "a"}, {"key": "a"}]}, "appears more than once"),
        ({"type": "set", "labels": ["a", "a"]}, "appears more than once"),
        ({"type": "choice", "choices": [{"key": "a"}]}, "2 to 255 options (it holds 1)"),
        ({"type": "score", "levels": [str(i) for i in range(11)]}, "2 to 10 levels (it holds 11)"),
        ({"type": "span", "labels": []}, "1 to 255 labels (it holds 0)"),
        ({"type": "set"}, "needs labels or criteria"),
        ({"type": "choice"}, "needs criteria or choices"),
        ({"type": "choice", "choices": [{"key": " "}, {"key": "b"}]}, "choices[0].key must not be blank"),
        ({"type": "noul", "instructions": "  "}, "instructions must not be blank"),
        ({"type": "choice", "criteria": {"a": "", "b": None}}, "criteria.a must not be blank"),
        ({"type": "set", "labels": ["a"], "threshold": 1.5}, "threshold must be in [0, 1]"),
        ({"type": "set", "labels": ["a"], "threshold": "high"}, "threshold: expected `float | null`, got `str`"),
        ({"type": "set", "labels": ["a" * 300]}, "labels[0]"),
        ({"type": "noul", "instructions": "x", "require_full_input": 1}, "require_full_input: expected `bool`"),
        ({"type": "noul", "instructions": "x", "require_full_input": None}, "require_full_input: expected `bool`"),
        ({"type": "noul", "instructions": "x", "require_full_input": "true"}, "require_full_input: expected `bool`"),
    ],
)
def test_invalid_questions_name_their_field(question: dict[str, Any], needle: str) -> None:
    assert needle in invalid(question)


def test_a_question_takes_only_its_types_fields() -> None:
    assert invalid({"type": "set", "labels": ["a"], "colour": "red"}) == "set questions do not take ['colour']"
    assert invalid({"type": "noul", "instructions": "x", "levels": ["a"]}) == "noul questions do not take ['levels']"
    assert "['threshold']" in invalid({"type": "choice", "criteria": {"a": None, "b": None}, "threshold": 0.5})
    assert "['head']" in invalid({"type": "set", "labels": ["a"], "head": "router"})


@pytest.mark.parametrize(
    "question, needle",
    [
        ("not an object", "a question must be an object"),
        ({"instructions": "x"}, "type must be one of choice, noul, score, set, span (it is missing)"),
        ({"type": "nope"}, "(it is 'nope')"),
        ({"type": 3}, "(it is not a string)"),
        ({"type": "box", "instructions": "the dog"}, "box questions"),
        ({"preset": "pii"}, "defines no presets"),
        ({"type": "span", "labels": ["a"], "head": "broad"}, "no broad span head"),
        (
            {"type": "noul", "instructions": "x", "overflow": "window"},
            "overflow window needs a model with a scan budget",
        ),
        (
            {"type": "noul", "instructions": "x", "overflow": "truncate", "require_full_input": True},
            "cannot go with overflow truncate",
        ),
        ({"type": "span", "labels": ["a"], "over": ["x", "y"]}, "a span question reads one field"),
        ({"type": "noul", "instructions": "x", "over": []}, "at least one field"),
        ({"type": "noul", "instructions": "x", "over": ["a", "a"]}, "more than once"),
    ],
)
def test_types_presets_heads_and_overflow(question: Any, needle: str) -> None:
    assert needle in invalid(question)


def test_the_slot_echoes_the_type_sent() -> None:
    assert sent_type({"type": "box"}) == "box" and sent_type({"type": 3}) is None and sent_type([]) is None
    read = read_all({"ok": {"type": "noul", "instructions": "x"}, "bad": {"type": "set", "labels": []}})
    assert isinstance(read["ok"], ReadQuestion) and isinstance(read["bad"], QuestionError)


def test_optional_fields_are_read() -> None:
    q = read_question(
        "q",
        {
            "type": "span",
            "labels": ["city"],
            "head": "router",
            "over": "answer",
            "threshold": 0,
            "require_full_input": True,
            "overflow": None,
        },
    )
    assert (q.over, q.threshold, q.require_full_input, q.overflow) == (("answer",), 0.0, True, None)
    assert read_question("q", {"type": "noul", "instructions": "x", "overflow": "truncate"}).overflow == "truncate"


# ------------------------------------------------------------------------------ states
def noul(**extra: Any) -> ReadQuestion:
    return read_question("q", {"type": "noul", "instructions": "x", **extra})


def test_states_without_typed_parts_read_as_before() -> None:
    assert state_text("plain text") == "plain text"
    assert state_text({"subject": "a", "message": "b"}) == '{"subject": "a", "message": "b"}'
    assert state_text(["x", 1]) == '["x", 1]'
    assert not has_typed_parts({"subject": "a"}) and has_typed_parts({"Prompt": "a"})


def test_typed_parts_are_labelled_sections_in_reading_order() -> None:
    state = {"answer": "Friday.", "request": "When is it?", "source": "The meeting is on Friday.", "id": 7}
    assert state_text(state) == (
        "Context:\nsource: The meeting is on Friday.\nid: 7\n\nRequest:\nWhen is it?\n\nResponse:\nFriday."
    )
    assert state_text({"user": "hi", "prompt": "there"}) == "Request:\nuser: hi\nprompt: there"
    span = read_question("s", {"type": "span", "labels": ["day"]})
    assert view_text(span, state) == "Friday."  # a span reads the answer part
    assert view_text(span, {"prompt": "When?", "source": "x"}) == "When?"  # else the user part


def test_over_reads_the_named_fields_in_state_order() -> None:
    state = {"a": "one", "b": {"n": 2}, "c": "three"}
    assert view_text(noul(over="a"), state) == "one"
    assert view_text(noul(over=["b"]), state) == '{"n": 2}'
    assert view_text(noul(over=["c", "a"]), state) == '{"a": "one", "c": "three"}'
    assert view_text(noul(), state) == state_text(state)


@pytest.mark.parametrize(
    "question, state, needle",
    [
        ({"over": "a"}, "text", "this state is text"),
        ({"over": "a"}, ["a"], "this state is an array"),
        ({"over": ["a", "zz"]}, {"a": 1}, "over names 'zz', which is not a field of the state"),
        ({"over": "a", "require_full_input": True}, {"a": 1, "b": 2}, "over leaves out ['b']"),
    ],
)
def test_over_on_a_state_it_cannot_read_is_invalid(question: dict[str, Any], state: Any, needle: str) -> None:
    with pytest.raises(QuestionError) as info:
        view_text(noul(**question), state)
    assert info.value.code == "invalid_question" and needle in info.value.message


def test_require_full_input_reads_the_whole_state() -> None:
    assert view_text(noul(over=["a", "b"], require_full_input=True), {"a": 1, "b": 2}) == '{"a": 1, "b": 2}'
    span = read_question("s", {"type": "span", "labels": ["x"], "require_full_input": True})
    with pytest.raises(QuestionError):
        view_text(span, {"answer": "a", "request": "b"})
    assert view_text(span, {"answer": "a"}) == "a"


# ------------------------------------------------------------------------------ confidence
def test_confidence_is_one_minus_the_normalised_entropy() -> None:
    assert round(confidence([0.504, 0.133, 0.362]), 3) == 0.107  # upstream's quickstart: 0.106 (rounded inputs)
    assert abs(confidence([0.504, 0.133, 0.362]) - 0.106) < 2e-3
    assert confidence([1.0, 0.0]) == 1.0 and confidence([0.5, 0.5]) == 0.0
    assert confidence([0.25] * 4) == pytest.approx(0.0, abs=1e-12)
    p = [0.9, 0.1]
    assert confidence(p) == pytest.approx(1 + (0.9 * math.log(0.9) + 0.1 * math.log(0.1)) / math.log(2))


# ------------------------------------------------------------------------------ the OpenAPI document's questions
def test_the_documented_question_types_hold_the_fields_the_reader_takes() -> None:
    from vllm_srun.adapters.schemas.decisions import QUESTION_TYPES
    from vllm_srun.adapters.surfaces.decision_questions import FIELDS, TYPES

    documented = {t.__struct_config__.tag: set(t.__struct_fields__) | {"type"} for t in QUESTION_TYPES}
    assert documented == {kind: set(FIELDS[kind]) for kind in TYPES}


def test_a_question_valid_by_the_document_reads_the_same() -> None:
    import msgspec

    from vllm_srun.adapters.schemas.decisions import Question

    sent = {"type": "choice", "instructions": "tone?", "choices": [{"key": "a"}, {"key": "b", "description": "bee"}]}
    documented = msgspec.convert(sent, Question)
    assert read_question("q", msgspec.to_builtins(documented)) == read_question("q", sent)
