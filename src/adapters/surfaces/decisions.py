"""POST /v1/decisions, its alias /v1/systemone, and /v1/systemone/batches (R-API-4/5, R-DEC, R-SC, R-LEN).

Each question is read in its slot (`decision_questions.py`), resolved against its state
(`decision_states.py`), rendered with the text it reads into a prompt and answered from the
next-token distribution restricted to its answer tokens (`decision_layout.py`; set and span
questions in `decision_labels.py`).

A question that cannot be answered (invalid, too long, past the deadline) fails in its own
slot, `{type, error: "<code>", message}`, before any forward of its own; the others are
answered. A request in which no question, of its own or of its `states`, is valid (every one
failed with `invalid_question`) is 400 `invalid_request` listing each reason. `/v1/systemone`
is the same route (the contract's alias). `states` are further states, each with its own
questions, answered in the same call and returned under their names in `states`; the
response's `usage` counts its own state alone. `/v1/systemone/batches` (our extension) asks
the same questions about many states.

A model that reads images and videos (`MediaQuestionAnswerer`) reads a state's `images`,
`videos` and (the request's own state) TypeSafe `assets` in front of its text: read, checked and
decoded once before any question is tokenized (`decision_media.py`); every row that reads them
runs in the model's `media` lane.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from vllm_srun.adapters.call import Call
from vllm_srun.adapters.contracts import QuestionAnswerer, QuestionError, StateMedium, is_question_answerer
from vllm_srun.adapters.schemas.decisions import (
    MAX_QUESTIONS,
    MAX_ROWS,
    BatchResult,
    DecisionsBatchBody,
    DecisionsBatchResponse,
    DecisionsBody,
    DecisionsOptions,
    DecisionsResponse,
    DecisionStateResponse,
    Usage,
)
from vllm_srun.adapters.serving.scheduler_loop import ForwardStats
from vllm_srun.adapters.serving.served import ServedModel
from vllm_srun.adapters.surfaces.common import Prepared, answer
from vllm_srun.adapters.surfaces.decision_layout import (
    Answered,
    Entry,
    all_invalid,
    answers_of,
    lay_out,
    prepare_entry,
    rows_of,
)
from vllm_srun.adapters.surfaces.decision_media import asset_errors, decode_all, read_sent
from vllm_srun.adapters.surfaces.decision_questions import read_all
from vllm_srun.domain.errors import InvalidRequest, RequestTooLarge, quoted

NO_SCAN_BUDGET = (
    "options.max_tokens is the scan budget of a model that reads long state parts in windows (its card's "
    "limits.max_scan_tokens); this model reads one bounded input, and a longer prompt fails its question "
    "with max_length_exceeded"
)


def answerer(served: ServedModel, call: Call) -> QuestionAnswerer:
    model = served.require_surface("decisions", call)
    assert is_question_answerer(model)  # checked when the model loaded
    return model


def _check_request(options: DecisionsOptions, questions: int) -> None:
    """What fails the whole request before any question is read (400/413)."""
    if options.max_tokens is not None:
        raise InvalidRequest(NO_SCAN_BUDGET)
    if questions > MAX_QUESTIONS:
        raise RequestTooLarge(f"the request asks {questions} questions (at most {MAX_QUESTIONS})")


def _check_rows(entries: Sequence[Entry]) -> None:
    rows = sum(e.rows_asked for e in entries)
    if rows > MAX_ROWS:
        raise RequestTooLarge(
            f"the questions need {rows} rows once set and span labels are laid out (at most {MAX_ROWS})"
        )


Part = tuple[Any, Mapping[str, Any], Mapping[str, QuestionError], tuple[StateMedium, ...]]


def _laid_out(parts: Sequence[Part]) -> list[Entry]:
    """Each (state, questions, questions failed already, media) read and laid out (CPU work)."""
    entries = []
    for state, questions, failed, media in parts:
        read = {**read_all(questions), **failed}
        entry = lay_out({name: read[name] for name in questions}, questions, state)
        entry.media = media
        entries.append(entry)
    return entries


def _prepared(model: QuestionAnswerer, entries: list[Entry], names: Sequence[str], replay: bool) -> list[Entry]:
    """Every entry tokenized (REPLAY: the golden check's, without the input budget); 400 when no
    question of any entry is valid (CPU work)."""
    for entry in entries:
        prepare_entry(model, entry, replay)
    reasons = all_invalid(list(zip(names, entries)))
    if reasons is not None:
        raise InvalidRequest(f"no question is valid ({reasons})")
    return entries


def _own(got: Answered) -> dict[str, Any]:
    return {
        "answers": got.answers,
        "usage": got.usage,
        "sets": got.sets or None,
        "spans": got.spans or None,
        "thresholds": got.thresholds or None,
    }


async def prepare_decisions(served: ServedModel, req: DecisionsBody, call: Call) -> Prepared[DecisionsResponse]:
    """/v1/decisions (and /v1/systemone, /v1/bundle's decisions tasks): validated and tokenized."""
    model = answerer(served, call)
    options = req.options or DecisionsOptions()
    shares = served.profile_for(options.profile).shares_context  # R-PROF-1: exact never shares
    states = req.states or {}
    asked = [req.questions] + [s.questions for s in states.values()]
    _check_request(options, sum(len(qs) for qs in asked))
    sent = await served.prepare(call, read_sent, model, req)  # 400 for bad media, before anything decodes
    media = await decode_all(served, model, sent)  # once per content, in the media workers
    parts: list[Part] = [(s.state, qs, asset_errors(s), m) for s, qs, m in zip(sent, asked, media)]
    entries = await served.prepare(call, _laid_out, parts)
    _check_rows(entries)
    names = ["", *(f"states.{name[:64]}." for name in states)]
    entries = await served.prepare(call, _prepared, model, entries, names, call.replay)
    rows, spans = await served.prepare(call, rows_of, model, entries, shares)

    def finish(stats: ForwardStats) -> DecisionsResponse:
        own, *others = answers_of(entries, rows, spans, stats.outputs)
        return DecisionsResponse(
            model=served.name,
            **_own(own),
            states={name: DecisionStateResponse(model=served.name, **_own(got)) for name, got in zip(states, others)}
            or None,
        )

    return Prepared(served, call, f"decisions:{model.cache_tag}", req, options, rows, finish, expires_rows=True)


async def decisions(served: ServedModel, req: DecisionsBody, call: Call) -> DecisionsResponse:
    return await answer(await prepare_decisions(served, req, call))


systemone = decisions  # the contract's alias: the same request, the same answer


async def systemone_batches(served: ServedModel, req: DecisionsBatchBody, call: Call) -> DecisionsBatchResponse:
    """/v1/systemone/batches: many states, the same questions; question errors stay in place."""
    model = answerer(served, call)
    options = req.options or DecisionsOptions()
    shares = served.profile_for(options.profile).shares_context  # R-PROF-1: exact never shares
    _check_request(options, len(req.states) * len(req.questions))
    ids = [s.id for s in req.states]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise InvalidRequest(f"states[].id must be unique ({quoted(dup)} appears more than once)")
    entries = await served.prepare(call, _laid_out, [(s.state, req.questions, {}, ()) for s in req.states])
    _check_rows(entries)
    names = [f"states[{i}]." for i in range(len(entries))]
    entries = await served.prepare(call, _prepared, model, entries, names, call.replay)
    rows, spans = await served.prepare(call, rows_of, model, entries, shares)

    def finish(stats: ForwardStats) -> DecisionsBatchResponse:
        answered = answers_of(entries, rows, spans, stats.outputs)
        results = [
            BatchResult(i, a.answers, a.usage, a.sets or None, a.spans or None, a.thresholds or None)
            for i, a in zip(ids, answered)
        ]
        total = Usage(sum(r.usage.input_tokens for r in results), 0)
        return DecisionsBatchResponse(model=served.name, results=results, usage=total)

    cache_tag = f"systemone_batches:{model.cache_tag}"
    prepared = Prepared(served, call, cache_tag, req, options, rows, finish, expires_rows=True)
    return await answer(prepared)
