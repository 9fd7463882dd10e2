"""POST /v1/bundle (R-PERF-1): several surface requests in one call, sharing forwards.

A bundle is refused as a whole only when it is malformed (400: not a bundle, no task, a task
with no id, no surface or several, ids not unique, a body beyond the JSON limits) or too large
(413: more than `--max-bundle-tasks` tasks; the body limit is `--max-request-bytes` as for every
route). Everything else happens per task and stays in the task's slot, `{id, status, error:
{code, message}}`, with the status the task would have had alone (400 a body its surface
refuses, e.g. `"input": []`, 404 unknown model, 422 unsupported surface, 429 overloaded, 504
deadline, …); such a task costs no forward and the others are answered.

The tasks of one model run as one unit:
- they are admitted together or not at all (R-ADM-1), for the bundle's tenant (R-FAIR-1, its
  key's, `http/auth.py`): their count against `--max-queue`, the bytes of their bodies against
  `--max-queued-tokens`, and against that tenant's own limits (R-FAIR-4);
- each is prepared (validated, tokenized) on its own, off the event loop when the task is large
  (as a request of its size would be, `adapters/offload.py`), held to the model's
  `max_request_tokens` on its own (413 in its slot); a cached answer takes no rows;
- the rows of all the others go to the model's scheduler in ONE submit, so they share
  forwards, and identical rows (same lane, same tokens, same payload) are computed once;
- each task's deadline is the bundle's `options.deadline_ms` or, when sooner, its own, counted
  from the bundle's arrival; a row not started by its deadline (a row shared by tasks: the
  latest of theirs) is not run, and its items answer `deadline_exceeded` in their slots
  (R-API-10; a surface without per-item answers: 504 in the task's slot).
Different models' units run concurrently. A client that goes away cancels them all (499).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgspec

from vllm_srun.adapters.call import Call
from vllm_srun.adapters.cancellation import race
from vllm_srun.adapters.schemas.bundle import (
    TASK_SURFACES,
    BundleOptions,
    BundleResponse,
    ReadBundle,
    TaskError,
    TaskResult,
)
from vllm_srun.adapters.schemas.common import json_encoder
from vllm_srun.adapters.serving.served import ServedModel
from vllm_srun.adapters.surfaces.admission import admission_tokens
from vllm_srun.adapters.surfaces.classify import prepare_classify
from vllm_srun.adapters.surfaces.common import NO_FORWARD, Prepared, any_expired
from vllm_srun.adapters.surfaces.decisions import prepare_decisions
from vllm_srun.adapters.surfaces.embeddings import prepare_embeddings
from vllm_srun.adapters.surfaces.rerank import prepare_rerank
from vllm_srun.domain.errors import (
    Cancelled,
    DeadlineExceeded,
    DomainError,
    InvalidRequest,
    Overloaded,
    RequestTooLarge,
    quoted,
)
from vllm_srun.domain.scheduling.rows import RowSpec

log = logging.getLogger("vllm_srun.bundle")

# a surface's prepare step (its CPU work off the event loop when the task is large; embeddings'
# also awaits media decoding), for the task's own `Call` (the bundle's, with the task's size)
PREPARE: dict[str, Callable[[ServedModel, Any, Call], Awaitable[Prepared[Any]]]] = {
    "embeddings": prepare_embeddings,
    "classify": prepare_classify,
    "rerank": prepare_rerank,
    "decisions": prepare_decisions,
}
INTERNAL_MESSAGE = "internal error; see the server log"

Lookup = Callable[[str | None], ServedModel]
StatusOf = Callable[[str], int]


@dataclasses.dataclass
class _Task:
    id: str
    surface: str
    body: msgspec.Struct  # None when its surface refused it (then `result` is set from the start)
    result: TaskResult | None = None
    prepared: Prepared[Any] | None = None
    size: int = 0  # the bytes of its body (as JSON): what decides where it is prepared

    def answer(self, response: msgspec.Struct) -> None:
        self.result = msgspec.structs.replace(TaskResult(self.id, 200), **{self.surface: response})

    def fail(self, exc: Exception, status_of: StatusOf) -> None:
        if isinstance(exc, DomainError):
            error = TaskError(exc.code, exc.message)
        else:  # never a stack trace in a body; the log has it
            log.error("bundle task %r failed", self.id, exc_info=exc)
            error = TaskError("internal_error", INTERNAL_MESSAGE)
        self.result = TaskResult(self.id, status_of(error.code), error=error)


def parse_tasks(req: ReadBundle, max_tasks: int, status_of: StatusOf) -> list[_Task]:
    """The bundle's tasks, or the refusal of the whole bundle (400 malformed, 413 too many); a
    task whose body its surface refused is answered already (400 in its slot)."""
    if len(req.tasks) > max_tasks:
        raise RequestTooLarge(f"too many tasks: {len(req.tasks)} (at most {max_tasks}, --max-bundle-tasks)")
    tasks, seen = [], set()
    for index, read in enumerate(req.tasks):
        if len(read.surfaces) != 1:
            raise InvalidRequest(
                f"tasks[{index}] must hold exactly one of {', '.join(TASK_SURFACES)} (it holds {len(read.surfaces)})"
            )
        if read.id in seen:
            raise InvalidRequest(f"tasks[].id must be unique ({quoted(read.id)} appears more than once)")
        seen.add(read.id)
        task = _Task(read.id, read.surfaces[0], read.body)
        if read.error is not None:
            task.fail(InvalidRequest(f"tasks[{index}].{task.surface}: {read.error}"), status_of)
        tasks.append(task)
    return tasks


async def bundle(
    lookup: Lookup,
    req: ReadBundle,
    call: Call,
    *,
    max_tasks: int,
    status_of: StatusOf,
    refused: Callable[[str], None] = lambda model: None,
) -> BundleResponse:
    """The answers of REQ's tasks, each model's admitted for CALL's tenant as one unit;
    REFUSED(model) is told of each unit refused 429 overloaded (`/metrics`)."""
    tasks = parse_tasks(req, max_tasks, status_of)
    units: dict[str, tuple[ServedModel, list[_Task]]] = {}
    for task in tasks:
        if task.result is not None:  # its body was refused: it costs no admission and no forward
            continue
        try:
            served = lookup(getattr(task.body, "model", None))
        except DomainError as exc:
            task.fail(exc, status_of)
            continue
        units.setdefault(served.name, (served, []))[1].append(task)
    options = req.options or BundleOptions()
    runs = [_run_unit(served, unit, options, call, status_of, refused) for served, unit in units.values()]
    if runs:
        await race(
            lambda: asyncio.gather(*runs),
            deadline_s=None,
            disconnected=call.disconnected,
            deadline_message="",
        )
    assert all(task.result is not None for task in tasks)
    return BundleResponse(results=[task.result for task in tasks if task.result is not None])


async def _run_unit(
    served: ServedModel,
    tasks: list[_Task],
    options: BundleOptions,
    call: Call,
    status_of: StatusOf,
    refused: Callable[[str], None],
) -> None:
    """One model's tasks: admitted together, prepared each, their rows in one submit."""
    try:
        tokens = await served.prepare(call, _admission_tokens, served, tasks)  # off the loop for a large bundle
        with served.admitted(call, len(tasks), tokens) as admitted:  # its rows are scheduled for its tenant too
            running = await _prepare(served, tasks, admitted, status_of)
            if running:
                await _run_rows(served, running, options.deadline_ms, admitted, status_of)
    except Cancelled:  # the client went away: the whole bundle is cancelled (499)
        raise
    except Exception as exc:  # the unit failed as a whole: overloaded, deadline, forward failed
        if isinstance(exc, Overloaded):
            refused(served.name)
        for task in tasks:
            if task.result is None:
                task.fail(exc, status_of)


def _admission_tokens(served: ServedModel, tasks: list[_Task]) -> int:
    """What the unit counts against `--max-queued-tokens` (each task's size noted on the way)."""
    total = 0
    for task in tasks:
        task.size = len(json_encoder.encode(task.body))
        total += admission_tokens(served, task.body, task.size)
    return total


async def _prepare(served: ServedModel, tasks: list[_Task], call: Call, status_of: StatusOf) -> list[_Task]:
    """Prepare each task for CALL, sized as the task (errors in its slot; cached answers done);
    the tasks left to run."""
    running = []
    for task in tasks:
        try:  # a small task is prepared on the loop, whatever the bundle's size
            prepared = await PREPARE[task.surface](served, task.body, dataclasses.replace(call, body_bytes=task.size))
            hit = await prepared.cached()
            if hit is not None:
                task.answer(hit)
            elif not prepared.rows:
                task.answer(await prepared.complete(NO_FORWARD))
            else:
                task.prepared = prepared
                running.append(task)
        except Exception as exc:
            task.fail(exc, status_of)
    return running


def task_deadline_ms(bundle_ms: float | None, own_ms: float | None) -> float | None:
    """A task's deadline: the bundle's, or its own when that is sooner (None: none)."""
    known = [ms for ms in (bundle_ms, own_ms) if ms is not None]
    return min(known) if known else None


def row_deadlines(deadlines: Sequence[float | None], where: Sequence[Sequence[int]], rows: int) -> list[float | None]:
    """Each shared row's deadline: the latest of the tasks it answers (None when one has none)."""
    out: list[float | None] = [0.0] * rows
    for deadline, indices in zip(deadlines, where):
        for i in indices:
            held = out[i]
            out[i] = None if deadline is None or held is None else max(held, deadline)
    return out


async def _run_rows(
    served: ServedModel,
    tasks: list[_Task],
    bundle_ms: float | None,
    call: Call,
    status_of: StatusOf,
) -> None:
    """The unit's rows in one submit (R-PERF-1), each row not started by its deadline not run
    (R-API-10): a task whose surface answers that per item gets `deadline_exceeded` in those
    items' slots, any other task a 504 in its own slot."""
    rows, where = unique_rows([t.prepared.rows for t in tasks if t.prepared is not None])
    deadlines = [task_deadline_ms(bundle_ms, t.prepared.options.deadline_ms) for t in tasks if t.prepared is not None]
    # R-PROF-2: one task under a profile that does not coalesce keeps the unit's rows out of other
    # requests' forwards (the others' answers stay within what their own profiles allow)
    strict = next(
        (t.prepared.profile for t in tasks if t.prepared is not None and not t.prepared.profile.coalesces), None
    )
    per_row = row_deadlines(deadlines, where, len(rows))
    stats = await served.run(rows, call, profile=strict, expire_rows=True, row_deadlines=per_row)
    for task, indices, deadline in zip(tasks, where, deadlines):
        assert task.prepared is not None
        own = dataclasses.replace(stats, outputs=tuple(stats.outputs[i] for i in indices))
        try:  # its answer is built for its own call (`Prepared.call`: its size)
            if not task.prepared.expires_rows and any_expired(own.outputs):
                raise DeadlineExceeded(f"no answer within options.deadline_ms={deadline:g}")
            task.answer(await task.prepared.complete(own))
        except Exception as exc:
            task.fail(exc, status_of)


def unique_rows(groups: Sequence[Sequence[RowSpec]]) -> tuple[list[RowSpec], list[list[int]]]:
    """The rows of several requests with identical rows once, and where each request's rows went."""
    rows: list[RowSpec] = []
    index: dict[Any, int] = {}
    where: list[list[int]] = []
    for group in groups:
        own = []
        for spec in group:
            key = (spec.lane, spec.tokens, _fingerprint(spec.payload))
            at = index.get(key)
            if at is None:
                at = index[key] = len(rows)
                rows.append(spec)
            own.append(at)
        where.append(own)
    return rows, where


def _fingerprint(value: Any) -> Any:
    """A hashable picture of a row payload's content; an object it cannot read is only itself."""
    if value is None or isinstance(value, (str, bytes, int, float, bool)):
        return value
    if isinstance(value, (list, tuple)):
        return tuple(_fingerprint(item) for item in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = tuple(_fingerprint(getattr(value, f.name)) for f in dataclasses.fields(value))
        return (type(value).__qualname__, fields)
    tobytes = getattr(value, "tobytes", None)  # numpy arrays
    if callable(tobytes) and hasattr(value, "dtype") and hasattr(value, "shape"):
        return (str(value.dtype), tuple(value.shape), tobytes())
    return ("object", id(value))
