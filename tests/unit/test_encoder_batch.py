"""The encoder port's plain value (`contracts/batch.py`): a `Batch` holds one planned forward's
rows and what each asks; `Batch.answer` runs each ask's rows through one call, in a fixed order,
and hands the outputs back in row order."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fakes import FakeEncoderEngine
from vllm_srun.adapters.contracts import Ask, Batch, Encoded, EngineRefused, as_encoder_engine


def _row(ids: Sequence[int], types: Sequence[int] | None = None) -> Encoded:
    return Encoded(list(ids), list(types) if types is not None else [0] * len(ids), False, len(ids))


def test_flat_ids_bounds_and_types() -> None:
    batch = Batch((_row([5, 6, 7]), _row([8]), _row([9, 10], [0, 1])), (Ask.EMBEDDING, Ask.LOGITS, Ask.TOKENS))
    assert batch.ids == (5, 6, 7, 8, 9, 10)
    assert batch.bounds == (0, 3, 4, 6)
    assert batch.type_ids == (0, 0, 0, 0, 0, 1)
    assert Batch.of([_row([1, 2])]).type_ids is None  # all 0: none given
    assert batch.asking(Ask.LOGITS) == [1] and len(batch) == 3


def test_a_batch_refuses_mismatched_or_no_rows() -> None:
    with pytest.raises(ValueError, match="2 rows with 1 asks"):
        Batch((_row([1]), _row([2])), (Ask.EMBEDDING,))
    with pytest.raises(ValueError, match="empty batch"):
        Batch((), ())


class Recorder:
    """Forwards that tag each row's output with its ask and remember every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[Ask, list[int]]] = []

    def forwards(self, *asks: Ask) -> dict[Ask, Any]:
        def make(ask: Ask) -> Any:
            def run(rows: Sequence[Encoded]) -> list[tuple[Ask, int]]:
                self.calls.append((ask, [r.ids[0] for r in rows]))
                return [(ask, r.ids[0]) for r in rows]

            return run

        return {ask: make(ask) for ask in asks}


def test_one_call_per_ask_in_a_fixed_order_answers_in_row_order() -> None:
    asks = (Ask.EMBEDDING, Ask.LOGITS, Ask.TOKENS, Ask.EMBEDDING, Ask.LOGITS)
    batch = Batch(tuple(_row([i]) for i in range(5)), asks)
    recorder = Recorder()
    out = batch.answer(recorder.forwards(*Ask))
    assert out == [(a, i) for i, a in enumerate(asks)]
    assert recorder.calls == [(Ask.TOKENS, [2]), (Ask.LOGITS, [1, 4]), (Ask.EMBEDDING, [0, 3])]


def test_one_ask_is_one_call_over_the_rows_as_they_are() -> None:
    batch = Batch.of([_row([3]), _row([1]), _row([2])], Ask.LOGITS)
    recorder = Recorder()
    assert batch.answer(recorder.forwards(Ask.LOGITS)) == [(Ask.LOGITS, 3), (Ask.LOGITS, 1), (Ask.LOGITS, 2)]
    assert recorder.calls == [(Ask.LOGITS, [3, 1, 2])]


def test_an_ask_the_engine_has_no_forward_for_is_refused_in_one_line() -> None:
    batch = Batch((_row([1]), _row([2])), (Ask.EMBEDDING, Ask.TOKENS))
    with pytest.raises(ValueError, match="no forward for rows that ask tokens"):
        batch.answer(Recorder().forwards(Ask.EMBEDDING))


@given(st.lists(st.sampled_from(list(Ask)), min_size=1, max_size=12))
def test_every_row_gets_its_own_answer_whatever_the_mix(asks: list[Ask]) -> None:
    batch = Batch(tuple(_row([i, i + 1]) for i in range(len(asks))), tuple(asks))
    recorder = Recorder()
    out = batch.answer(recorder.forwards(*Ask))
    assert out == [(a, i) for i, a in enumerate(asks)]
    assert len(recorder.calls) == len(set(asks))  # one call per ask present
    assert batch.bounds[-1] == len(batch.ids) == 2 * len(asks)


class OldContract:
    """An encoder engine of the contract before the port: `embed` and `classify_logits`, no `forward`."""

    name = "old"
    accounting = "packed"
    kernel_switch_tokens = None
    forward_threads = False
    determinism = None

    def describe(self) -> dict[str, Any]:
        return {}

    def embed(self, batch: Sequence[Encoded]) -> list[Any]:
        return []

    def classify_logits(self, batch: Sequence[Encoded]) -> list[Any]:
        return []


def test_an_encoder_engine_is_one_forward_over_a_batch() -> None:
    engine = as_encoder_engine(FakeEncoderEngine())
    batch = Batch((_row([1, 2]), _row([3])), (Ask.TOKENS, Ask.EMBEDDING))
    assert engine.forward(batch) == [(Ask.TOKENS, 3), (Ask.EMBEDDING, 3)]
    with pytest.raises(EngineRefused, match="the old engine has no encoder forward"):
        as_encoder_engine(OldContract())  # type: ignore[arg-type]
