"""R-CALL-1: one request's `Call` goes by argument through admission, the served model and the
scheduler loop; no request state rides in a context variable."""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.fakes import FakeClock
from vllm_srun.adapters.call import REPLAY, Call
from vllm_srun.adapters.request_timing import RequestTiming
from vllm_srun.adapters.serving.scheduler_loop import ForwardStats
from vllm_srun.adapters.serving.served import ServedModel
from vllm_srun.domain.errors import NotReady
from vllm_srun.domain.inputs.input_budget import NO_BUDGET, InputBudget, in_force
from vllm_srun.domain.scheduling.admission import Admission, AdmissionLimits
from vllm_srun.domain.scheduling.rows import RowSpec
from vllm_srun.domain.scheduling.tenants import DEFAULT_TENANT, Priority
from vllm_srun.domain.settings.engine_args import EngineArgs
from vllm_srun.domain.worker.lifecycle import ModelState

SRC = Path(__file__).resolve().parents[2] / "src"


class RecordingLoop:
    """A scheduler loop that answers each row with its payload and keeps the calls it was given."""

    def __init__(self) -> None:
        self.calls: list[tuple[Call, bool]] = []

    async def submit(
        self, rows: Sequence[RowSpec], call: Call, *, exact: bool = False, deadlines: Any = None
    ) -> ForwardStats:
        self.calls.append((call, exact))
        return ForwardStats(tuple(r.payload for r in rows), 0.0, 0.0, 1, 0)


class Surfaced:  # the `surfaces` a LoadedModel lists, nothing else is read
    surfaces = frozenset({"embeddings"})


def served_model(**fields: Any) -> ServedModel:
    return ServedModel(name="m", artifact="m", args=EngineArgs(), device="cpu", **fields)


def test_a_call_is_a_frozen_record_and_each_step_makes_a_copy() -> None:
    timing = RequestTiming()
    call = Call(tenant="acme", body_bytes=10, timing=timing)
    task = dataclasses.replace(call, body_bytes=3)
    assert (task.body_bytes, call.body_bytes, task.timing, task.tenant) == (3, 10, timing, "acme")  # timing shared
    with pytest.raises(dataclasses.FrozenInstanceError):
        call.tenant = "other"  # type: ignore[misc]
    assert Call().tenant == DEFAULT_TENANT and not Call().replay and REPLAY.replay
    assert Call().priority is None and Call().deadline_ms is None and Call().held is None


def test_admission_hands_the_block_the_call_holding_its_ticket_for_its_tenant() -> None:
    admission = Admission(AdmissionLimits(max_queue=4, max_queued_tokens=1000))
    served = served_model(admission=admission, clock=FakeClock())
    with served.admitted(Call(tenant="acme"), 1, 100) as call:
        assert call.held is not None and call.held.admission is admission
        assert call.held.ticket.tenant == "acme" and admission.pending_requests == 1
    assert admission.pending_requests == 0
    plain = Call()
    with served_model().admitted(plain, 1, 100) as unadmitted:  # no admission: the call as it was
        assert unadmitted is plain


def test_the_served_model_gives_the_scheduler_loop_the_call_and_counts_its_rows() -> None:
    admission = Admission(AdmissionLimits(max_queue=4, max_queued_tokens=1000))
    loop = RecordingLoop()
    served = served_model(admission=admission, clock=FakeClock(), scheduler_loop=loop)
    rows = [RowSpec(7, "a"), RowSpec(5, "b")]

    async def scenario() -> ForwardStats:
        with served.admitted(Call(tenant="acme"), 1, 100) as call:
            stats = await served.run(rows, dataclasses.replace(call, priority=Priority.BATCH))
            assert admission.pending_tokens == 12  # the rows' counted tokens, no longer the bound of 100
            return stats

    assert asyncio.run(scenario()).outputs == ("a", "b")
    (given, exact), *_ = loop.calls
    assert (given.tenant, given.priority) == ("acme", Priority.BATCH) and exact  # exact: the default profile


def test_a_warming_model_answers_only_the_golden_checks_replay() -> None:
    served = served_model(model=Surfaced(), status=ModelState.WARMING)
    assert served.require_surface("embeddings", REPLAY) is served.model
    with pytest.raises(NotReady):
        served.require_surface("embeddings", Call())


def test_the_input_budget_is_left_out_only_for_the_replay() -> None:
    budget = InputBudget(8, "truncate")
    assert in_force(budget, replay=False) is budget
    assert in_force(budget, replay=True) is NO_BUDGET


def test_no_request_state_rides_in_a_context_variable() -> None:
    declared = [
        str(path.relative_to(SRC))
        for path in sorted(SRC.rglob("*.py"))
        if re.search(r"\bContextVar\b", path.read_text(encoding="utf-8"))
    ]
    assert declared == [], f"request state goes in the Call (adapters/call.py), not a ContextVar: {declared}"
