"""Set and span questions laid out as noul rows and put back together (R-OUT-6,
surfaces/decision_labels.py): the word scan, the selection and span-merging rules, and the
errors found before any row."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vllm_srun.adapters.contracts import QuestionError
from vllm_srun.adapters.schemas.decisions import DecisionAnswer
from vllm_srun.adapters.surfaces.decision_labels import (
    SCAN_BUDGET,
    assemble,
    error_of,
    merge_spans,
    plan,
    scan_words,
    select,
    taken_names,
)
from vllm_srun.adapters.surfaces.decision_questions import ReadQuestion, read_question
from vllm_srun.adapters.surfaces.decision_states import view_text


def labelled(kind: str, labels: list, **extra: object) -> ReadQuestion:
    return read_question("q", {"type": kind, "labels": labels, **extra})


probability = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


def test_scan_words_are_code_point_offsets_of_words() -> None:
    text = "Zoë's e-mail, 3.5 €  naïve—ok"
    words = scan_words(text)
    assert [text[a:b] for a, b in words] == ["Zoë's", "e-mail", "3.5", "naïve", "ok"]
    assert all(text[a:b] == text[a:b].strip() for a, b in words)
    assert scan_words("  ,;  ") == ()


@given(st.text(max_size=60))
def test_scan_words_are_ordered_and_disjoint(text: str) -> None:
    words = scan_words(text)
    assert all(0 <= a < b <= len(text) for a, b in words)
    assert all(b1 <= a2 for (_, b1), (a2, _) in itertools.pairwise(words))


@given(st.lists(probability, min_size=1, max_size=10), probability)
def test_set_selects_the_labels_at_or_over_the_threshold(ps: list[float], threshold: float) -> None:
    labels = [f"l{i}" for i in range(len(ps))]
    got = select(labels, ps, threshold)
    assert got.probabilities == dict(zip(labels, ps))
    assert got.selected == [label for label, p in zip(labels, ps) if p >= threshold]  # in the question's order


@given(st.lists(st.lists(probability, min_size=6, max_size=6), min_size=1, max_size=3), probability)
def test_spans_are_the_runs_of_words_at_or_over_the_threshold(ps: list[list[float]], threshold: float) -> None:
    text = "one two three four five six"
    words = scan_words(text)
    labels = [f"L{i}" for i in range(len(ps))]
    spans = merge_spans(text, labels, words, ps, threshold)
    assert [(s.start, labels.index(s.label)) for s in spans] == sorted((s.start, labels.index(s.label)) for s in spans)
    for li, label in enumerate(labels):
        # every word over the threshold is in exactly one span of its label, every other word in none
        covered = [wi for s in spans if s.label == label for wi, (a, b) in enumerate(words) if s.start <= a < s.end]
        assert sorted(covered) == [wi for wi in range(len(words)) if ps[li][wi] >= threshold]
        for s in (s for s in spans if s.label == label):
            inside = [wi for wi, (a, _) in enumerate(words) if s.start <= a < s.end]
            assert s.text == text[s.start : s.end] and s.start == words[inside[0]][0] and s.end == words[inside[-1]][1]
            assert inside == list(range(inside[0], inside[-1] + 1))  # consecutive words
            assert s.probability == pytest.approx(sum(ps[li][w] for w in inside) / len(inside))
            before, after = inside[0] - 1, inside[-1] + 1  # a span is a maximal run
            assert before < 0 or ps[li][before] < threshold
            assert after >= len(words) or ps[li][after] < threshold


def test_set_rows_are_one_noul_per_label_and_answers_come_back_by_label() -> None:
    q = labelled("set", ["billing", {"key": "refund", "description": "asks for money back"}], instructions="Topics?")
    p = plan("topics", q, "charged twice")
    assert p.error is None and [r.name for r in p.rows] == ["topics.billing", "topics.refund"]
    assert all(r.kind == "noul" for r in p.rows)
    assert "billing" in str(p.rows[0].instructions) and p.rows[0].criteria is None
    assert p.rows[1].criteria == {"true": "asks for money back", "false": None}
    answers: dict[str, DecisionAnswer] = {}
    got = assemble(p, [0.7, 0.2], answers)
    assert answers == {
        "topics.billing": DecisionAnswer("noul", noul=0.7),
        "topics.refund": DecisionAnswer("noul", noul=0.2),
    }
    assert got == select(["billing", "refund"], [0.7, 0.2], 0.5)
    complete: dict[str, DecisionAnswer] = {}
    got = assemble(p, [0.7, 0.2], complete, complete=True)  # require_full_input: the set and every label
    assert isinstance(got, type(select([], [], 0.5))) and got.input_coverage == "complete"
    assert all(a.input_coverage == "complete" for a in complete.values())


def test_span_rows_are_a_presence_row_then_label_by_word() -> None:
    state = {"text": "Alice met Bob"}  # an object state: offsets count in its JSON text
    q = labelled("span", ["person", "city"], threshold=0.6)
    p = plan("who", q, view_text(q, state))
    words = scan_words(p.text)
    assert p.text == '{"text": "Alice met Bob"}' and p.words == words
    assert len(p.rows) == 1 + 2 * len(words) and p.rows[0].name == "who"
    assert "[Bob]" in str(p.rows[len(words)].instructions) and "person" in str(p.rows[len(words)].instructions)
    n = len(words)
    ps = [0.9] + [0.1] * n + [0.1] * n
    alice = next(t for t, (a, b) in enumerate(words) if p.text[a:b] == "Alice")
    ps[1 + alice] = 0.8  # person: Alice
    answers: dict[str, DecisionAnswer] = {}
    spans = assemble(p, ps, answers)
    assert answers == {"who": DecisionAnswer("noul", noul=0.9)}
    assert isinstance(spans, list) and [(s.label, s.text, s.probability) for s in spans] == [("person", "Alice", 0.8)]
    assert p.text[spans[0].start : spans[0].end] == "Alice"


def test_over_budget_scans_fail_in_place_without_rows() -> None:
    many = " ".join(["w"] * (SCAN_BUDGET // 2 + 1))
    over = plan("s", labelled("span", ["a", "b"]), many)
    assert over.rows == [] and over.error is not None and over.error.code == "scan_budget_exceeded"
    under = plan("s", labelled("span", ["a", "b"]), " ".join(["w"] * (SCAN_BUDGET // 2)))
    assert under.error is None and len(under.rows) == 1 + SCAN_BUDGET


def test_a_failed_row_fails_its_question_naming_the_label() -> None:
    p = plan("topics", labelled("set", ["a", "b"]), "x")
    assert error_of(p, [None, None]) is None
    err = error_of(p, [None, QuestionError("max_length_exceeded", "too long")])
    assert err is not None and err.code == "max_length_exceeded" and err.message == "label 'b': too long"
    s = plan("who", labelled("span", ["city"]), "in Paris")
    err = error_of(s, [None, None, QuestionError("max_length_exceeded", "too long")])
    assert err is not None and err.message == "label 'city' at word 'Paris': too long"


def test_a_set_answer_may_not_take_another_questions_name() -> None:
    assert taken_names({"t": labelled("set", ["a"]), "t.b": labelled("set", ["a"])}) == {}
    taken = taken_names({"t": labelled("set", ["a"]), "t.a": labelled("set", ["x"])})
    assert list(taken) == ["t"] and taken["t"].code == "invalid_question"
    assert taken["t"].message == "labels: the answer 't.a' would take the name of another question"
