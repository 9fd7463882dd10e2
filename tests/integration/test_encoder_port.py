"""The encoder family's one backend port (issue 47 item 3): a planned forward is one
`EncoderEngine.forward(Batch)` call whatever its rows ask (pooled embeddings, head logits, token
states for the sparse / multi-vector / token heads), and every row gets the answer it gets in a
forward of its own kind (the engine runs each ask's rows as before: the same kernels, the same bits)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from vllm_srun.adapters.contracts import Ask, Batch, BatchOutputs, LoadContext, LogitsRow
from vllm_srun.adapters.contracts.outputs import SparseVector, TokenOutputRow
from vllm_srun.adapters.contracts.token_heads import TokenLogitsRow
from vllm_srun.adapters.devices.torch_devices import CpuDevice
from vllm_srun.adapters.engines.registry import EngineRegistry
from vllm_srun.adapters.families.encoder import EncoderFamily, EncoderModel
from vllm_srun.adapters.models.encoder_arch import EncoderModuleDefaults
from vllm_srun.adapters.models.token_classifier import token_logits
from vllm_srun.domain.scheduling.rows import DEFAULT_LANE
from vllm_srun.domain.settings.engine_args import EngineArgs

pytest.importorskip("torch")
TEXTS = ["a", "the quick brown fox", "red", "the quick brown fox jumps over the lazy dog", "blue bird"]


class Counting:
    """The model's engine, counting its port calls and the asks of each."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.batches: list[tuple[Ask, ...]] = []

    def forward(self, batch: Batch) -> BatchOutputs:
        self.batches.append(batch.asks)
        return self.inner.forward(batch)


def _load(folder: Path, engine: str = "native") -> tuple[EncoderModel, Counting]:
    """The model as the `exact` profile loads it (batch-invariant kernels whatever the load-time
    timings say, so a row gets the same bits in any forward)."""
    context = LoadContext(
        device=CpuDevice(), args=EngineArgs(), engines=EngineRegistry(), engine_choice=engine, prefer_invariant=True
    )
    model = EncoderFamily().load(folder, context)
    assert isinstance(model, EncoderModel)
    assert isinstance(model.reference.encoder, EncoderModuleDefaults)  # the engines read its attributes plainly
    counting = Counting(model.encoder_engine)
    model.encoder_engine = counting  # type: ignore[assignment]
    return model, counting


def _same(got: Any, want: Any) -> bool:
    if isinstance(want, SparseVector):
        return got == want
    return np.asarray(got).tobytes() == np.asarray(want).tobytes()


@pytest.fixture(scope="module")
def both_heads(encoder_fixture, tmp_path_factory: pytest.TempPathFactory) -> Path:  # type: ignore[no-untyped-def]
    """The classify fixture serving embeddings too, so one forward may mix pooled and head rows."""
    folder = tmp_path_factory.mktemp("port") / "tiny-both"
    shutil.copytree(encoder_fixture("classify"), folder)
    manifest = json.loads((folder / "srun.json").read_text())
    manifest["surfaces"] = ["embeddings", "classify"]
    (folder / "srun.json").write_text(json.dumps(manifest))
    return folder


@pytest.mark.parametrize("engine", ["native", "onnxruntime"])
def test_pooled_and_head_rows_share_one_call(both_heads: Path, engine: str) -> None:
    if engine == "onnxruntime":
        pytest.importorskip("onnxruntime")
    model, counting = _load(both_heads, engine)
    rows = model.tokenize(TEXTS, truncate=True)
    payloads: list[Any] = [LogitsRow(r) if i % 2 else r for i, r in enumerate(rows)]
    mixed = model.run(DEFAULT_LANE, payloads)
    assert counting.batches == [tuple(Ask.LOGITS if i % 2 else Ask.EMBEDDING for i in range(len(rows)))]
    pooled = model.run(DEFAULT_LANE, rows[0::2])
    heads = model.run(DEFAULT_LANE, [LogitsRow(r) for r in rows[1::2]])
    assert all(_same(mixed[2 * i], want) for i, want in enumerate(pooled))
    assert all(_same(mixed[2 * i + 1], want) for i, want in enumerate(heads))
    assert np.asarray(mixed[0]).shape == (model.dimensions,) and np.asarray(mixed[1]).shape == (len(model.labels),)


def test_token_rows_ride_in_the_same_call(encoder_fixture) -> None:  # type: ignore[no-untyped-def]
    model, counting = _load(encoder_fixture("colbert"))
    rows = model.tokenize(TEXTS, truncate=True)
    payloads: list[Any] = [TokenOutputRow(r, "multi_vector") if i in (1, 3) else r for i, r in enumerate(rows)]
    mixed = model.run(DEFAULT_LANE, payloads)
    assert len(counting.batches) == 1 and counting.batches[0].count(Ask.TOKENS) == 2
    alone = [model.run(DEFAULT_LANE, [p])[0] for p in payloads]  # each row in a forward of its own
    assert all(_same(got, want) for got, want in zip(mixed, alone, strict=True))
    assert mixed[1].shape == (len(rows[1].ids) - 1, model.multi_vector_dimensions)


def test_sparse_rows_through_the_port(encoder_fixture) -> None:  # type: ignore[no-untyped-def]
    model, counting = _load(encoder_fixture("splade"))
    rows = model.tokenize(TEXTS[:3], truncate=True)
    got = model.run(DEFAULT_LANE, [TokenOutputRow(r, "sparse", keep_special=i == 0) for i, r in enumerate(rows)])
    assert counting.batches == [(Ask.TOKENS,) * 3]
    assert all(isinstance(v, SparseVector) and v.indices for v in got)


def test_a_token_head_reads_the_port_token_states(encoder_fixture) -> None:  # type: ignore[no-untyped-def]
    model, counting = _load(encoder_fixture("token"))
    rows = model.tokenize(TEXTS, truncate=True)
    got = model.run(DEFAULT_LANE, [TokenLogitsRow(r) for r in rows])
    assert counting.batches == [(Ask.TOKENS,) * len(rows)]
    want = token_logits(model.reference, model.token_head, rows)  # each row alone, padded, then the head
    assert all(_same(g, w) for g, w in zip(got, want, strict=True))
