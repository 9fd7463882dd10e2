"""POST /v1/decisions, /v1/systemone and /v1/systemone/batches (R-API-4/5, R-SC, R-LEN).

Each question is rendered with the state into a prompt and answered from the next-token
distribution restricted to its answer tokens: noul → P(yes); choice → one key per option
(`probabilities` by option name, `choice` the most probable, `confidence` its probability);
score → one level token "0".."N-1" (`score` = Σ level × P(level), `legend`, `probabilities`);
set and span → noul rows per label (and per word), put back together as `sets` / `spans`
(decision_labels.py).

A question that cannot be answered (invalid, too long) fails before any forward: in place on
/v1/decisions and the batches route (`{type, error: {code, message}}`), and on /v1/systemone
the whole request answers 400 `question_failed` naming the question and its code.
`usage.input_tokens` counts the state once plus every answered question, in both layouts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vllm_srun.adapters.contracts import (
    AskedQuestion,
    PreparedQuestion,
    PreparedState,
    QuestionAnswerer,
    is_question_answerer,
    probabilities_per_question,
    rows_for,
)
from vllm_srun.adapters.request_timing import RequestTiming
from vllm_srun.adapters.schemas.decisions import (
    MAX_QUESTIONS,
    MAX_ROWS,
    BatchResult,
    BoxQuestion,
    DecisionAnswer,
    DecisionsBatchRequest,
    DecisionsBatchResponse,
    DecisionsOptions,
    DecisionsRequest,
    DecisionsResponse,
    DecisionsUsage,
    NoulCriteria,
    Question,
    QuestionErrorBody,
    SetQuestion,
    SetResult,
    SpanItem,
    SpanQuestion,
)
from vllm_srun.adapters.serving.scheduler_loop import ForwardStats
from vllm_srun.adapters.serving.served import Disconnected, ServedModel
from vllm_srun.adapters.surfaces.common import Prepared, answer
from vllm_srun.adapters.surfaces.decision_labels import Plan, assemble, check_names, error_of, plan
from vllm_srun.domain.errors import InvalidRequest, QuestionFailed, RequestTooLarge, UnsupportedSurface, quoted
from vllm_srun.domain.rows import RowSpec


def _asked_one(name: str, q: Question) -> AskedQuestion:
    kind = type(q).__struct_config__.tag
    criteria: Any = None if isinstance(q, BoxQuestion | SetQuestion | SpanQuestion) else q.criteria
    if isinstance(criteria, NoulCriteria):
        criteria = {"true": criteria.true, "false": criteria.false}
    return AskedQuestion(name, str(kind), q.instructions, criteria)


def layout(questions: dict[str, Question], state: Any) -> list[Plan]:
    """Each question's rows for STATE: itself, or a set/span question's noul rows."""
    out = []
    for name, q in questions.items():
        if isinstance(q, SetQuestion | SpanQuestion):
            out.append(plan(name, q, state))
        else:
            one = _asked_one(name, q)
            out.append(Plan(name, one.kind, rows=[one]))
    return out


def asked(plans: Sequence[Plan]) -> list[AskedQuestion]:
    return [row for p in plans for row in p.rows]


def _answer(q: PreparedQuestion, probs: Any) -> DecisionAnswer:
    if q.error is not None:
        return DecisionAnswer(q.kind, error=QuestionErrorBody(q.error.code, q.error.message))
    assert q.rendered is not None
    p = [float(x) for x in probs]
    if q.kind == "noul":
        return DecisionAnswer("noul", noul=p[0])
    best = max(range(len(p)), key=lambda i: (p[i], -i))
    labels = q.rendered.labels
    by_label = dict(zip(labels, p))
    if q.kind == "choice":
        return DecisionAnswer("choice", choice=labels[best], confidence=p[best], probabilities=by_label)
    score = sum(i * x for i, x in enumerate(p))
    return DecisionAnswer("score", score=score, confidence=p[best], legend=q.rendered.legend, probabilities=by_label)


class Answered:
    """One state's answers, and the `sets` / `spans` entries of its set and span questions."""

    def __init__(self) -> None:
        self.answers: dict[str, DecisionAnswer] = {}
        self.sets: dict[str, SetResult] = {}
        self.spans: dict[str, list[SpanItem]] = {}


def _answers(plans: Sequence[Plan], prepared: PreparedState, probs: Sequence[Any]) -> Answered:
    out = Answered()
    it = iter(probs)
    questions = iter(prepared.questions)
    for p in plans:
        mine = [next(questions) for _ in p.rows]
        got: list[Any] = [None if q.error is not None else next(it) for q in mine]
        if p.kind not in ("set", "span"):
            out.answers[p.name] = _answer(mine[0], got[0])
            continue
        err = error_of(p, [q.error for q in mine])
        if err is not None:
            out.answers[p.name] = DecisionAnswer(p.kind, error=QuestionErrorBody(err.code, err.message))
            continue
        entry = assemble(p, [float(g[0]) for g in got], out.answers)
        if isinstance(entry, SetResult):
            out.sets[p.name] = entry
        else:
            out.spans[p.name] = entry
    return out


def _failures(plans: Sequence[Plan], prepared: PreparedState) -> list[tuple[str, Any]]:
    """(question, error) of each question that cannot be answered, in order."""
    out = []
    questions = iter(prepared.questions)
    for p in plans:
        mine = [next(questions) for _ in p.rows]
        err = error_of(p, [q.error for q in mine]) if p.kind in ("set", "span") else mine[0].error
        if err is not None:
            out.append((p.name, err))
    return out


def _check(req: DecisionsRequest | DecisionsBatchRequest, states: int) -> None:
    if isinstance(req, DecisionsRequest) and req.assets:
        raise UnsupportedSurface("media assets need an image model; this model reads text only")
    if states * len(req.questions) > MAX_QUESTIONS:
        raise RequestTooLarge(f"states × questions is {states * len(req.questions)} (at most {MAX_QUESTIONS})")
    check_names(req.questions)


def _check_rows(plans: Sequence[Sequence[Plan]]) -> None:
    rows = sum(len(p.rows) for state in plans for p in state)
    if rows > MAX_ROWS:
        raise RequestTooLarge(
            f"the questions need {rows} rows once set and span labels are laid out (at most {MAX_ROWS})"
        )


def _rows_of(model: QuestionAnswerer, prepared: list[PreparedState]) -> tuple[list[RowSpec], list[tuple[int, int]]]:
    """Every state's rows, for one scheduler request, and each state's span of them."""
    rows: list[RowSpec] = []
    spans = []
    for p in prepared:
        own = rows_for(p, model.share(p))
        spans.append((len(rows), len(rows) + len(own)))
        rows += own
    return rows, spans


def _answers_of(
    plans: list[list[Plan]],
    prepared: list[PreparedState],
    rows: list[RowSpec],
    spans: list[tuple[int, int]],
    stats: ForwardStats,
) -> list[Answered]:
    return [
        _answers(pl, p, probabilities_per_question(rows[a:b], stats.outputs[a:b]))
        for pl, p, (a, b) in zip(plans, prepared, spans)
    ]


def _usage(prepared: PreparedState) -> DecisionsUsage:
    return DecisionsUsage(prepared.input_tokens, 0)


def answerer(served: ServedModel) -> QuestionAnswerer:
    model = served.require_surface("decisions")
    assert is_question_answerer(model)  # checked when the model loaded
    return model


async def prepare_decisions(served: ServedModel, req: DecisionsRequest) -> Prepared[DecisionsResponse]:
    """/v1/decisions: question errors stay in place."""
    model = answerer(served)
    _check(req, 1)
    plans = layout(req.questions, req.state)
    _check_rows([plans])
    return _single(served, model, req, plans, await served.prepare(model.prepare, req.state, asked(plans)))


async def decisions(
    served: ServedModel, req: DecisionsRequest, timing: RequestTiming | None, disconnected: Disconnected | None = None
) -> DecisionsResponse:
    return await answer(await prepare_decisions(served, req), timing, disconnected)


async def systemone(
    served: ServedModel, req: DecisionsRequest, timing: RequestTiming | None, disconnected: Disconnected | None = None
) -> DecisionsResponse:
    """/v1/systemone: a failed question fails the request with 400 `question_failed`."""
    model = answerer(served)
    _check(req, 1)
    plans = layout(req.questions, req.state)
    _check_rows([plans])
    prepared = await served.prepare(model.prepare, req.state, asked(plans))
    failed = _failures(plans, prepared)
    if failed:
        name, err = failed[0]
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        raise QuestionFailed(f"question {quoted(name)} failed: {err.code}: {err.message}{more}")
    return await answer(_single(served, model, req, plans, prepared), timing, disconnected)


def _single(
    served: ServedModel, model: QuestionAnswerer, req: DecisionsRequest, plans: list[Plan], prepared: PreparedState
) -> Prepared[DecisionsResponse]:
    options = req.options or DecisionsOptions()
    rows, spans = _rows_of(model, [prepared])

    def finish(stats: ForwardStats) -> DecisionsResponse:
        (got,) = _answers_of([plans], [prepared], rows, spans, stats)
        return DecisionsResponse(
            model=served.name,
            answers=got.answers,
            usage=_usage(prepared),
            sets=got.sets or None,
            spans=got.spans or None,
        )

    return Prepared(served, f"decisions:{model.cache_tag}", req, options, rows, finish)


async def systemone_batches(
    served: ServedModel,
    req: DecisionsBatchRequest,
    timing: RequestTiming | None,
    disconnected: Disconnected | None = None,
) -> DecisionsBatchResponse:
    """/v1/systemone/batches: many states, the same questions; question errors stay in place."""
    model = answerer(served)
    _check(req, len(req.states))
    ids = [s.id for s in req.states]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise InvalidRequest(f"states[].id must be unique ({quoted(dup)} appears more than once)")
    plans = [layout(req.questions, s.state) for s in req.states]
    _check_rows(plans)
    prepared = await served.prepare(lambda: [model.prepare(s.state, asked(pl)) for s, pl in zip(req.states, plans)])
    options = req.options or DecisionsOptions()
    rows, spans = await served.prepare(_rows_of, model, prepared)

    def finish(stats: ForwardStats) -> DecisionsBatchResponse:
        answered = _answers_of(plans, prepared, rows, spans, stats)
        results = [
            BatchResult(i, a.answers, _usage(p), a.sets or None, a.spans or None)
            for i, a, p in zip(ids, answered, prepared)
        ]
        total = DecisionsUsage(sum(r.usage.input_tokens for r in results), 0)
        return DecisionsBatchResponse(model=served.name, results=results, usage=total)

    cache_tag = f"systemone_batches:{model.cache_tag}"
    return await answer(Prepared(served, cache_tag, req, options, rows, finish), timing, disconnected)
