"""One state's questions laid out as rows and put back together as answers (R-API-4/5, R-DEC-2/5, R-SC).

An `Entry` is a state and its questions: the request's own, one of its `states`, or one state
of a batch. Each question takes a *slot*: its error (read in `decision_questions.py`, resolved
against the state in `decision_states.py`, or found while tokenizing), or its rows. Questions
that read the same text of the state the same way (`overflow`) share a *view*: one prepared
state (`QuestionAnswerer.prepare`), so shared context runs that text once for all of them.
An entry's media (its state's images and videos, decoded) are read in front of every view's text.

A view of `require_full_input` questions is prepared with `overflow: reject` whatever the
deployment's `input.overflow`: its text is never cut, so an answered question read all of it
(`input_coverage: complete`) and a text too long fails it with `max_length_exceeded`. A view
of `overflow: truncate` questions is cut at its end to fit, like the deployment's truncate.

Answers: noul → P(yes); choice → `probabilities` by option, `choice` the most probable;
score → `probabilities` and `legend` (each level's text as the model read it: JSON for an object
or array) by level, `score` = Σ level × P(level); choice and score
carry `confidence` = 1 − the normalised entropy of their probabilities (1: all on one answer,
0: spread evenly).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm_srun.adapters.contracts import (
    AskedQuestion,
    PreparedQuestion,
    PreparedState,
    QuestionAnswerer,
    QuestionError,
    SharedRow,
    StateMedium,
    probabilities_per_question,
    rows_for,
)
from vllm_srun.adapters.contracts.decisions import content_text
from vllm_srun.adapters.schemas.decisions import Coverage, DecisionAnswer, SetResult, SpanItem, Usage
from vllm_srun.adapters.surfaces.decision_labels import Plan, assemble, error_of, plan, taken_names
from vllm_srun.adapters.surfaces.decision_questions import INVALID, ReadQuestion, sent_type
from vllm_srun.adapters.surfaces.decision_states import view_text
from vllm_srun.domain.scheduling.answers import EXPIRED
from vllm_srun.domain.scheduling.rows import RowSpec

DEADLINE = QuestionError("deadline_exceeded", "the question was not started before options.deadline_ms")


def confidence(probabilities: Sequence[float]) -> float:
    """1 − H(p) / ln(n): how sure a distribution over n ≥ 2 answers is (natural logs; 0·ln 0 = 0)."""
    n = len(probabilities)
    if n < 2:
        return 1.0
    entropy = -sum(p * math.log(p) for p in probabilities if p > 0.0)
    return min(1.0, max(0.0, 1.0 - entropy / math.log(n)))


@dataclass
class Slot:
    """One question of an entry: its error, or its rows in its view."""

    name: str
    kind: str | None  # the type it was sent with (echoed when it fails)
    error: QuestionError | None = None
    plan: Plan | None = None
    view: int = -1
    first: int = 0  # its first row in the view's questions
    complete: bool = False  # require_full_input: answered only when its view was read whole


@dataclass
class View:
    text: str
    overflow: str | None  # None: the deployment's input.overflow
    asked: list[AskedQuestion] = field(default_factory=list)
    prepared: PreparedState | None = None


@dataclass
class Entry:
    slots: list[Slot] = field(default_factory=list)
    views: list[View] = field(default_factory=list)
    media: tuple[StateMedium, ...] = ()  # the state's images and videos, in front of every view's text

    @property
    def rows_asked(self) -> int:
        return sum(len(v.asked) for v in self.views)


def _plan_of(q: ReadQuestion, text: str) -> Plan:
    if q.kind in ("set", "span"):
        return plan(q.name, q, text)
    row = AskedQuestion(q.name, q.kind, q.instructions, q.criteria)
    return Plan(q.name, q.kind, rows=[row])


def lay_out(read: Mapping[str, ReadQuestion | QuestionError], sent: Mapping[str, Any], state: Any) -> Entry:
    """STATE's questions (READ from SENT) as slots and views, before anything is tokenized."""
    entry = Entry()
    views: dict[tuple[str, str | None], int] = {}
    taken = taken_names(read)
    for name, q in read.items():
        slot = Slot(name, sent_type(sent[name]))
        entry.slots.append(slot)
        if isinstance(q, QuestionError):
            slot.error = q
            continue
        if name in taken:
            slot.error = taken[name]
            continue
        try:
            text = view_text(q, state)
        except QuestionError as exc:
            slot.error = exc
            continue
        slot.plan = _plan_of(q, text)
        if slot.plan.error is not None:
            slot.error = slot.plan.error
            continue
        overflow = "truncate" if q.overflow == "truncate" else "reject" if q.require_full_input else None
        slot.complete = q.require_full_input
        key = (text, overflow)
        if key not in views:
            views[key] = len(entry.views)
            entry.views.append(View(text, overflow))
        view = entry.views[views[key]]
        slot.view, slot.first = views[key], len(view.asked)
        view.asked += slot.plan.rows
    return entry


def prepare_entry(model: QuestionAnswerer, entry: Entry, replay: bool = False) -> Entry:
    """Tokenize every view (CPU work: run it through `ServedModel.prepare`); a question whose
    rows cannot be asked takes its error into its slot. REPLAY: the golden check's (no input budget)."""
    for view in entry.views:
        if entry.media:  # only a model that reads media is given any (surfaces/decision_media.py)
            view.prepared = model.prepare(
                view.text, view.asked, overflow=view.overflow, media=entry.media, replay=replay
            )
        else:
            view.prepared = model.prepare(view.text, view.asked, overflow=view.overflow, replay=replay)
    for slot in entry.slots:
        mine = _prepared_of(entry, slot)
        if slot.error is not None or slot.plan is None:
            continue
        if slot.plan.kind in ("set", "span"):
            slot.error = error_of(slot.plan, [q.error for q in mine])
            for q in mine if slot.error is not None else ():
                q.error = q.error or slot.error  # a set or span fails whole: none of its rows runs
        else:
            slot.error = mine[0].error
    return entry


def _prepared_of(entry: Entry, slot: Slot) -> list[PreparedQuestion]:
    if slot.plan is None or slot.view < 0:
        return []
    prepared = entry.views[slot.view].prepared
    assert prepared is not None
    return prepared.questions[slot.first : slot.first + len(slot.plan.rows)]


def all_invalid(entries: Sequence[tuple[str, Entry]]) -> str | None:
    """When no question of any entry is valid (each failed with invalid_question): every
    question's reason, one line (cut short past a few kilobytes); else None."""
    slots = [(prefix, s) for prefix, e in entries for s in e.slots]
    if not slots or any(s.error is None or s.error.code != INVALID for _, s in slots):
        return None
    reasons, size = [], 0
    for i, (prefix, s) in enumerate(slots):
        assert s.error is not None
        reason = f"{prefix}{s.name[:64]}: {s.error.message[:200]}"
        if size + len(reason) > 4000:
            reasons.append(f"… and {len(slots) - i} more")
            break
        reasons.append(reason)
        size += len(reason) + 2
    return "; ".join(reasons)


# ------------------------------------------------------------------------------ rows and answers
ViewSpans = list[list[tuple[int, int]]]  # per entry, per view: its rows' [start, end) in the request's rows


def rows_of(model: QuestionAnswerer, entries: Sequence[Entry], shares: bool = True) -> tuple[list[RowSpec], ViewSpans]:
    """Every entry's rows for one scheduler request, and each view's span of them; a state is read
    once for its questions only where the request's profile shares (SHARES, R-PROF-1)."""
    rows: list[RowSpec] = []
    spans: ViewSpans = []
    for entry in entries:
        mine = []
        for view in entry.views:
            assert view.prepared is not None
            own = rows_for(view.prepared, model.share(view.prepared, shares))
            mine.append((len(rows), len(rows) + len(own)))
            rows += own
        spans.append(mine)
    return rows, spans


@dataclass
class Answered:
    """One entry's answers, and the `sets` / `spans` / `thresholds` of its set and span questions."""

    answers: dict[str, DecisionAnswer] = field(default_factory=dict)
    sets: dict[str, SetResult] = field(default_factory=dict)
    spans: dict[str, list[SpanItem]] = field(default_factory=dict)
    thresholds: dict[str, float] = field(default_factory=dict)
    usage: Usage = field(default_factory=lambda: Usage(0, 0))


def _failed(slot: Slot) -> DecisionAnswer:
    assert slot.error is not None
    code = slot.error.code
    return DecisionAnswer(slot.kind, error=code, message=slot.error.message)  # type: ignore[arg-type]


def _answer(q: PreparedQuestion, probs: Any, complete: bool) -> DecisionAnswer:
    assert q.rendered is not None
    coverage: Coverage | None = "complete" if complete else None
    p = [float(x) for x in probs]
    if q.kind == "noul":
        return DecisionAnswer("noul", noul=p[0], input_coverage=coverage)
    best = max(range(len(p)), key=lambda i: (p[i], -i))
    labels = q.rendered.labels
    by_label = dict(zip(labels, p))
    sure = confidence(p)
    if q.kind == "choice":
        return DecisionAnswer(
            "choice", choice=labels[best], confidence=sure, probabilities=by_label, input_coverage=coverage
        )
    score = sum(i * x for i, x in enumerate(p))
    return DecisionAnswer(
        "score",
        score=score,
        confidence=sure,
        legend={level: content_text(text) for level, text in (q.rendered.legend or {}).items()},
        probabilities=by_label,
        input_coverage=coverage,
    )


def _usage(entry: Entry, read: Sequence[set[int]]) -> Usage:
    """Each view's text once plus every question read (R-SC-1), whichever layout ran; a view of
    which nothing was read counts nothing."""
    tokens = 0
    for view, done in zip(entry.views, read):
        if done and view.prepared is not None:
            tokens += len(view.prepared.state_ids) + sum(len(view.prepared.questions[i].ids) for i in done)
    return Usage(tokens, 0)


def answer_entry(entry: Entry, per_view: Sequence[Sequence[Any]]) -> Answered:
    """ENTRY's answers in question order, from each view's outputs (one probability vector, or
    EXPIRED, per answerable question of the view, in order)."""
    out = Answered()
    by_view: list[dict[int, Any]] = []
    for view, probs in zip(entry.views, per_view):
        assert view.prepared is not None
        answerable = [i for i, q in enumerate(view.prepared.questions) if q.error is None]
        by_view.append(dict(zip(answerable, probs)))
    read: list[set[int]] = [set() for _ in entry.views]
    for slot in entry.slots:
        if slot.error is not None or slot.plan is None:
            out.answers[slot.name] = _failed(slot)
            continue
        got = by_view[slot.view]
        mine = _prepared_of(entry, slot)
        values = [got[slot.first + i] for i in range(len(mine))]
        if any(v is EXPIRED for v in values):  # a set or span fails whole
            out.answers[slot.name] = _failed(Slot(slot.name, slot.kind, DEADLINE))
            continue
        read[slot.view].update(range(slot.first, slot.first + len(mine)))
        if slot.plan.kind not in ("set", "span"):
            out.answers[slot.name] = _answer(mine[0], values[0], slot.complete)
            continue
        result = assemble(slot.plan, [float(v[0]) for v in values], out.answers, slot.complete)
        out.thresholds[slot.name] = slot.plan.threshold
        if isinstance(result, SetResult):
            out.sets[slot.name] = result
        else:
            out.spans[slot.name] = result
    out.usage = _usage(entry, read)
    return out


def _per_question(rows: Sequence[RowSpec], outputs: Sequence[Any]) -> list[Any]:
    """One output per answerable question: a shared row past its deadline is EXPIRED for each
    of its questions."""
    flat: list[Any] = []
    for spec, got in zip(rows, outputs):
        if got is EXPIRED:
            flat += [EXPIRED] * (len(spec.payload.questions) if isinstance(spec.payload, SharedRow) else 1)
        else:
            flat += probabilities_per_question([spec], [got])
    return flat


def answers_of(
    entries: Sequence[Entry], rows: Sequence[RowSpec], spans: ViewSpans, outputs: Sequence[Any]
) -> list[Answered]:
    """Every entry's answers from the request's row outputs (in row order)."""
    return [
        answer_entry(entry, [_per_question(rows[a:b], outputs[a:b]) for a, b in view_spans])
        for entry, view_spans in zip(entries, spans)
    ]
