"""The C++ layer stacks of architectures that are not BERT-shaped (engines/cpu_stacks.py,
csrc/cpu_stacks.cpp): what each declines (the caller keeps its Python layer loop), bad weights
and inputs refused in one line, and the op library keyed by every file it is built from. The
stacks' answers (the loop's bits, transformers' numbers) are tested with each architecture:
test_decoder_encoder_parity.py, test_modernbert_parity.py, tests/e2e/test_architectures_e2e.py."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from vllm_srun.adapters.engines import cpp_ops
from vllm_srun.adapters.engines.cpu_onednn import PackedEncoder, onednn_unsupported
from vllm_srun.adapters.engines.cpu_op_library import VarlenOps, load_varlen_attention
from vllm_srun.adapters.engines.cpu_stacks import NO_TENSOR, STACKS
from vllm_srun.adapters.families.fixtures.encoder_fixture import write_arch_package
from vllm_srun.adapters.models.deberta_v2 import load_deberta_v2
from vllm_srun.adapters.models.decoder_encoder import load_decoder_encoder
from vllm_srun.adapters.models.encoder_arch import eager_linears
from vllm_srun.adapters.models.modernbert import load_modernbert
from vllm_srun.adapters.models.tokenization import Encoded
from vllm_srun.adapters.models.unpadded import EAGER_OPS, PackedRows
from vllm_srun.domain.worker.kernels import bucket_rows

pytestmark = pytest.mark.skipif(
    cpp_ops.compiler(os.environ) is None or onednn_unsupported("cpu", torch.float32) is not None,
    reason="no C++ compiler or no oneDNN packed linears here",
)


@pytest.fixture(scope="module")
def ops() -> VarlenOps:
    why = load_varlen_attention(lambda _m: None)
    assert why is None, why  # a compiler is here: a failed build is a failure, not a skip
    return VarlenOps()


def _decoder(root: Path, **sizes: int) -> Any:
    folder = root / "-".join(f"{k}{v}" for k, v in sizes.items())
    folder.mkdir()
    write_arch_package(folder, "qwen3", "embed", 0, **sizes)
    return load_decoder_encoder(folder)[0]


@pytest.fixture(scope="module")
def decoder(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return _decoder(tmp_path_factory.mktemp("qwen3"), hidden=64, heads=4, kv_heads=2, intermediate=96)


@pytest.fixture(scope="module")
def deberta(tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder = tmp_path_factory.mktemp("deberta")
    write_arch_package(folder, "deberta-v2", "embed", 0)  # 2 heads of 16, relative attention
    return load_deberta_v2(folder)[0]


@pytest.fixture(scope="module")
def modernbert(tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder = tmp_path_factory.mktemp("modernbert")
    write_arch_package(folder, "modernbert", "embed", 0)  # 2 heads of 16
    return load_modernbert(folder)[0]


def _packed_rows(lengths: list[int]) -> PackedRows:
    return PackedRows.build([Encoded(list(range(1, n + 1)), [0] * n, False, n) for n in lengths], pad_to=bucket_rows)


def test_each_stack_runs_the_packed_linears_and_declines_the_rest(
    ops: VarlenOps, decoder: Any, modernbert: Any, deberta: Any, tmp_path: Path
) -> None:
    for encoder, name in ((decoder, "decoder"), (modernbert, "modernbert"), (deberta, "deberta")):
        assert encoder.one_call_stack == name
        packed = PackedEncoder(encoder, None).layer_linears
        assert ops.runs_stack(encoder, packed)
        assert not ops.runs_stack(encoder, eager_linears(encoder))  # the eager linears: the loop
        assert STACKS[name].build(encoder, packed, lambda _dim: False) is None  # no kernel for the heads
    narrow = _decoder(tmp_path, hidden=32, heads=4, kv_heads=2, intermediate=48)  # heads of 8: no kernel
    plain = copy.deepcopy(deberta)
    plain.relative = False  # no position terms: the plain one-call attention of the loop serves it
    assert not ops.runs_stack(plain, PackedEncoder(plain, None).layer_linears)
    assert not ops.runs_stack(narrow, PackedEncoder(narrow, None).layer_linears)
    linears = PackedEncoder(decoder, None).layer_linears
    rows = _packed_rows([5, 3])
    cos = sin = torch.zeros(rows.rows_total, 1, 16)
    x = torch.zeros(rows.rows_total, 64)
    assert ops.stack(decoder, linears, x.bfloat16(), rows, (cos, sin, None)) is None  # FP32 only
    odd = next(n for n in range(rows.rows_total, 4096) if bucket_rows(n) != n)
    assert ops.stack(decoder, linears, torch.zeros(odd, 64), rows, (cos, sin, None)) is None  # not a row bucket
    assert ops.stack(decoder, linears, x, rows, (cos, sin, None)) is not None
    assert EAGER_OPS.stack(decoder, linears, x, rows, (cos, sin, None)) is None
    assert not EAGER_OPS.runs_stack(decoder, linears)


def test_bad_weights_and_inputs_are_refused_in_one_line(ops: VarlenOps, decoder: Any) -> None:
    layer = [torch.ones(4)] * 12
    norm = torch.ones(4)
    with pytest.raises(RuntimeError, match="12 tensors a layer, got 11"):
        torch.classes.srun_cpu.DecoderWeights(layer[:11], [1e-6] * 4, 2, 1, 2, 8, norm, 1e-6)
    with pytest.raises(RuntimeError, match="four eps a layer"):
        torch.classes.srun_cpu.DecoderWeights(layer, [1e-6] * 3, 2, 1, 2, 8, norm, 1e-6)
    with pytest.raises(RuntimeError, match="kv_heads must divide heads"):
        torch.classes.srun_cpu.DecoderWeights(layer, [1e-6] * 4, 3, 2, 2, 8, norm, 1e-6)
    with pytest.raises(RuntimeError, match="even head size"):
        torch.classes.srun_cpu.DecoderWeights(layer, [1e-6] * 4, 2, 1, 3, 8, norm, 1e-6)
    with pytest.raises(RuntimeError, match="unknown activation tanh"):
        torch.classes.srun_cpu.ModernBertWeights(layer, [1e-5] * 2, [1], 2, "tanh", norm, NO_TENSOR, 1e-5)
    with pytest.raises(RuntimeError, match="two eps and one global flag a layer"):
        torch.classes.srun_cpu.ModernBertWeights(layer, [1e-5] * 2, [1, 0], 2, "gelu", norm, NO_TENSOR, 1e-5)
    with pytest.raises(RuntimeError, match="two eps, a scale and two tables a layer"):
        torch.classes.srun_cpu.DebertaWeights(layer, [1e-5] * 2, [0.1], [], [], 2, 0, "gelu", "none")
    weights, _ = STACKS["decoder"].build(decoder, PackedEncoder(decoder, None).layer_linears, ops.supports)
    rows = _packed_rows([5, 3])
    x = torch.zeros(rows.rows_total, 64)
    table = torch.zeros(4, 64)
    wrong = torch.zeros(rows.rows_total, 1, 8)  # head size 16 here
    with pytest.raises(RuntimeError, match=r"cos and sin are \[N, 1, head_dim\]"):
        torch.ops.srun_cpu.decoder_layers(weights, x, rows.starts, rows.lengths, wrong, wrong, table, 31)
    with pytest.raises(RuntimeError, match="float32"):
        torch.ops.srun_cpu.decoder_layers(weights, x.double(), rows.starts, rows.lengths, wrong, wrong, table, 31)
    right = torch.zeros(rows.rows_total, 1, 16)
    for keep, why in (
        (torch.tensor([0, rows.rows_total]), "outside the"),
        (torch.tensor([0.0, 1.0]), "int64 vector"),
        (torch.zeros(0, dtype=torch.long), "non-empty"),
    ):
        with pytest.raises(RuntimeError, match=why):
            torch.ops.srun_cpu.decoder_layers(weights, x, rows.starts, rows.lengths, right, right, table, 31, keep)


def test_the_decoder_stack_keeps_only_the_tokens_asked_with_their_bits(ops: VarlenOps, decoder: Any) -> None:
    """KEEP: the last layer's output linear, feed-forward and final norm on those tokens only. They
    get the bits they have when every token goes on (the stack and the Python loop alike), and the
    loop keeping them gets the stack's bits."""
    from tests.integration.encoder_parity import LayerLoop

    linears = PackedEncoder(decoder, None).layer_linears
    gen = torch.Generator().manual_seed(0)
    rows = PackedRows.build(
        [Encoded(torch.randint(1, 90, (n,), generator=gen).tolist(), [0] * n, False, n) for n in (7, 3, 12, 1)],
        pad_to=bucket_rows,
    )
    ends = rows.starts + rows.lengths - 1
    keep = torch.cat([ends, ends[-1:].expand(bucket_rows(4) - 4)])
    with torch.inference_mode():
        full = decoder.packed_forward(rows, linears, ops)
        kept = decoder.packed_forward(rows, linears, ops, keep=keep)
        looped = decoder.packed_forward(rows, linears, LayerLoop(), keep=keep)
    assert kept.shape == (len(keep), full.shape[1])
    assert torch.equal(kept, full.index_select(0, keep))
    assert torch.equal(looped, kept)


def test_the_library_is_keyed_by_every_file_it_is_built_from(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A change to any source or to a header of `csrc/` builds a new library (a stale one would
    lack the ops the Python side calls)."""
    for name, text in (("main.cpp", "a"), ("more.cpp", "b"), ("shared.h", "c")):
        (tmp_path / name).write_text(text)
    monkeypatch.setattr(cpp_ops, "CSRC", tmp_path)
    op = cpp_ops.CppOp("main.cpp", "test ops", "TEST_OPS", ("test_ops", "probe"), also=("more.cpp",))
    assert [p.name for p in op.sources] == ["main.cpp", "more.cpp"]
    first = op.library_path(tmp_path / "cache")
    keys = {first}
    for name in ("more.cpp", "shared.h", "main.cpp"):
        (tmp_path / name).write_text((tmp_path / name).read_text() + " changed")
        keys.add(op.library_path(tmp_path / "cache"))
    assert len(keys) == 4 and first.name.startswith("main-")
