"""The CPU forward's C++ ops (engines/cpu_op_library.py). The one-call attention: SDPA's answers per
row, a row's bits independent of the rest of the forward and of the thread count, padding rows left
zero, bad input refused, and every reason not to use it turned into the per-run path with one line.
The one-pass residual add + LayerNorm: eager's answers, a row's bits its own, eager kept where the
op has no kernel."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from vllm_srun.adapters.engines import cpp_ops, cpu_op_library
from vllm_srun.adapters.engines.cpu_op_library import VarlenOps, cpu_ops, load_varlen_attention
from vllm_srun.adapters.models.tokenization import Encoded
from vllm_srun.adapters.models.unpadded import EAGER_OPS, DisentangledTables, PackedRows, RelativeBias, reach

pytestmark = pytest.mark.skipif(
    cpp_ops.compiler(os.environ) is None, reason="no C++ compiler: the op cannot be built here"
)


@pytest.fixture(scope="module")
def op() -> VarlenOps:
    why = load_varlen_attention(lambda _m: None)
    assert why is None, why  # a compiler is here: a failed build is a failure, not a skip
    return VarlenOps()


def _rows(lengths: list[int]) -> PackedRows:
    return PackedRows.build([Encoded(list(range(1, n + 1)), [0] * n, False, n) for n in lengths])


def _qkv(packed: PackedRows, heads: int, dim: int, extra: int = 0, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(packed.tokens + extra, 3 * heads * dim, generator=gen)


@pytest.mark.parametrize(("heads", "dim"), [(12, 32), (2, 8), (4, 16), (3, 64), (2, 80), (2, 96), (1, 128)])
def test_every_row_gets_sdpa_answer(op: VarlenOps, heads: int, dim: int) -> None:
    packed = _rows([100, 64, 33, 17, 16, 7, 7, 2, 1])
    qkv = _qkv(packed, heads, dim)
    ours = op.attention(qkv, packed, heads)
    want = EAGER_OPS.attention(qkv, packed, heads)
    assert ours.shape == want.shape
    assert (ours - want).abs().max().item() < 1e-5


def test_a_rows_bits_do_not_depend_on_the_forward_or_the_thread_count(op: VarlenOps) -> None:
    alone = _rows([37])
    crowd = _rows([90, 60, 37, 5, 1])
    q_alone = _qkv(alone, 12, 32, seed=1)
    q_crowd = _qkv(crowd, 12, 32, seed=2)
    start = 150  # the 37-token row sits after the 90 and 60 ones in sorted order
    q_crowd[start : start + 37] = q_alone
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = op.attention(q_crowd, crowd, 12)[start : start + 37]
        torch.set_num_threads(2)
        two = op.attention(q_crowd, crowd, 12)[start : start + 37]
    finally:
        torch.set_num_threads(threads)
    by_itself = op.attention(q_alone, alone, 12)
    assert torch.equal(one, by_itself) and torch.equal(two, by_itself)


def _relative(longest: int, heads: int) -> RelativeBias:
    """A bias of each distance and head, the same whatever LONGEST (as MPNet's bucket lookup is)."""
    return RelativeBias.over(longest, lambda n: 2 * torch.sin(0.37 * n[:, None] + 1.3 * torch.arange(heads)))


@pytest.mark.parametrize(("heads", "dim"), [(12, 32), (4, 16), (3, 64), (2, 96)])
def test_rows_with_a_relative_position_bias_get_sdpa_answer(op: VarlenOps, heads: int, dim: int) -> None:
    """MPNet's scores: each (query, key) adds the bias of its distance, on every query block and
    key group of the op, including a row's last partial ones."""
    packed = _rows([100, 64, 33, 17, 16, 7, 2, 1])
    qkv = _qkv(packed, heads, dim)
    relative = _relative(packed.longest, heads)
    ours = op.attention(qkv, packed, heads, relative)
    want = EAGER_OPS.attention(qkv, packed, heads, relative)
    assert (ours - want).abs().max().item() < 1e-5
    assert (ours - op.attention(qkv, packed, heads)).abs().max().item() > 1e-3  # the bias changed the answer


def test_a_biased_rows_bits_do_not_depend_on_the_forward(op: VarlenOps) -> None:
    alone, crowd = _rows([37]), _rows([90, 60, 37, 5, 1])
    q_alone, q_crowd = _qkv(alone, 4, 32, seed=1), _qkv(crowd, 4, 32, seed=2)
    q_crowd[150 : 150 + 37] = q_alone
    wide, narrow = _relative(90, 4), _relative(37, 4)
    in_crowd = op.attention(q_crowd, crowd, 4, wide)[150 : 150 + 37]
    assert torch.equal(in_crowd, op.attention(q_alone, alone, 4, narrow))


@pytest.mark.parametrize(("heads", "dim"), [(16, 128), (4, 32), (2, 16)])
def test_a_causal_bias_skips_the_keys_after_each_block_without_changing_a_bit(
    op: VarlenOps, heads: int, dim: int
) -> None:
    """Under a causal table (-inf for every key after its query) a block of queries scores the keys
    up to its last query only. A table with -1e30 there instead weighs those keys the same (the
    kernel's exp clamps at e^-87) but is not causal to the op, which then scores every key: both
    give the same bits, and SDPA's causal answer."""
    packed = _rows([140, 64, 33, 17, 16, 7, 2, 1])
    qkv = _qkv(packed, heads, dim, seed=3)
    causal = RelativeBias.causal(packed.longest, heads, qkv)
    finite = RelativeBias(causal.table.clamp(min=-1e30), causal.centre)
    skipped = op.attention(qkv, packed, heads, causal)
    assert torch.equal(skipped, op.attention(qkv, packed, heads, finite))
    assert (skipped - EAGER_OPS.attention(qkv, packed, heads, causal)).abs().max().item() < 1e-5


def test_a_bias_that_does_not_reach_every_distance_is_refused(op: VarlenOps) -> None:
    packed = _rows([20, 3])
    qkv = _qkv(packed, 2, 16)
    short = _relative(10, 2)  # built for rows of 10 tokens
    with pytest.raises(RuntimeError, match="does not cover rows of 20 tokens"):
        op.attention(qkv, packed, 2, short)
    with pytest.raises(RuntimeError, match=r"\[heads, span\]"):
        op.attention(qkv, packed, 2, _relative(20, 3))  # three heads' bias for two heads


def _disentangled(longest: int, heads: int, dim: int) -> DisentangledTables:
    """Relative keys and queries of each distance (−300 … 300) and head, the same whatever LONGEST."""
    gen = torch.Generator().manual_seed(5)
    keys, queries = (torch.randn(heads, dim, 601, generator=gen) for _ in range(2))
    centre, distances = reach(longest)
    columns = distances + 300
    return DisentangledTables(keys[:, :, columns].contiguous(), queries[:, :, columns].contiguous(), centre)


def _disentangled_by_hand(qkv: torch.Tensor, packed: PackedRows, heads: int, scale: float, t: DisentangledTables):  # type: ignore[no-untyped-def]
    """DeBERTa's scores spelled out in FP64, row by row: scale · q_i · (k_j + Kr[i − j]) + k_j · Qr'[i − j]."""
    dim = qkv.shape[1] // (3 * heads)
    out = torch.zeros(qkv.shape[0], heads * dim, dtype=torch.float64)
    for start, n in zip(packed.starts.tolist(), packed.lengths.tolist()):
        q, k, v = qkv[start : start + n].double().view(n, 3, heads, dim).unbind(1)  # [n, heads, dim]
        pos = torch.arange(n)
        columns = t.centre + pos[:, None] - pos[None, :]  # [i, j]
        kr = t.keys.double()[:, :, columns]  # [heads, dim, i, j]
        qr = t.queries.double()[:, :, columns]
        content = torch.einsum("ihc,jhc->hij", q, k)
        c2p = torch.einsum("ihc,hcij->hij", q, kr)
        p2c = torch.einsum("jhc,hcij->hij", k, qr)
        weights = torch.softmax(scale * (content + c2p) + p2c, dim=-1)
        out[start : start + n] = torch.einsum("hij,jhc->ihc", weights, v).reshape(n, heads * dim)
    return out


@pytest.mark.parametrize(("heads", "dim"), [(12, 32), (4, 16), (3, 64), (2, 96)])
def test_rows_with_deberta_position_terms_get_the_scores_spelled_out(op: VarlenOps, heads: int, dim: int) -> None:
    """DeBERTa's c2p and p2c terms, read from tables by distance on every query block and key group
    of the op, including a row's last partial ones, against the sums written out in FP64."""
    packed = _rows([100, 64, 33, 17, 16, 7, 2, 1])
    qkv = _qkv(packed, heads, dim) * 0.5
    scale = (3 * dim) ** -0.5  # DeBERTa's: both position terms count
    tables = _disentangled(packed.longest, heads, dim)
    ours = op.disentangled_attention(qkv, packed, heads, scale, tables)
    assert ours is not None
    want = _disentangled_by_hand(qkv, packed, heads, scale, tables)
    assert (ours.double() - want).abs().max().item() < 1e-5
    plain = torch.ops.srun_cpu.varlen_attention(qkv, packed.starts, packed.lengths, heads, scale)
    assert (ours - plain).abs().max().item() > 1e-2  # the terms changed the answer
    assert EAGER_OPS.disentangled_attention(qkv, packed, heads, scale, tables) is None  # eager: per run


def test_a_deberta_rows_bits_do_not_depend_on_the_forward(op: VarlenOps) -> None:
    alone, crowd = _rows([37]), _rows([90, 60, 37, 5, 1])
    q_alone, q_crowd = _qkv(alone, 4, 32, seed=1), _qkv(crowd, 4, 32, seed=2)
    q_crowd[150 : 150 + 37] = q_alone
    scale = 96**-0.5
    in_crowd = op.disentangled_attention(q_crowd, crowd, 4, scale, _disentangled(90, 4, 32))
    by_itself = op.disentangled_attention(q_alone, alone, 4, scale, _disentangled(37, 4, 32))
    assert in_crowd is not None and by_itself is not None
    assert torch.equal(in_crowd[150 : 150 + 37], by_itself)


def test_deberta_tables_that_do_not_fit_are_refused(op: VarlenOps) -> None:
    packed = _rows([20, 3])
    qkv = _qkv(packed, 2, 16)
    with pytest.raises(RuntimeError, match="do not cover rows of 20 tokens"):
        op.disentangled_attention(qkv, packed, 2, 0.1, _disentangled(10, 2, 16))  # built for rows of 10
    wide = _disentangled(20, 2, 16)
    with pytest.raises(RuntimeError, match=r"\[heads, 16, width\]"):
        op.disentangled_attention(qkv, packed, 2, 0.1, _disentangled(20, 3, 16))  # three heads' tables
    with pytest.raises(RuntimeError, match="different widths"):
        torch.ops.srun_cpu.varlen_attention_disentangled(
            qkv, packed.starts, packed.lengths, 2, 0.1, wide.keys, wide.queries[:, :, :-1].contiguous(), wide.centre
        )


def test_padding_rows_are_zero_and_never_read(op: VarlenOps) -> None:
    packed = PackedRows.build([Encoded([1] * n, [0] * n, False, n) for n in (9, 4)], pad_to=lambda n: n + 3)
    assert packed.tokens == 13 and packed.rows_total == 16
    qkv = _qkv(packed, 4, 16, extra=3)
    clean = op.attention(qkv, packed, 4)
    qkv[13:] = float("nan")  # whatever the padding rows hold
    out = op.attention(qkv, packed, 4)
    assert torch.equal(out[:13], clean[:13]) and torch.equal(out[13:], torch.zeros(3, 64))
    assert torch.equal(EAGER_OPS.attention(qkv, packed, 4)[13:], torch.zeros(3, 64))


def test_bad_input_is_refused_by_the_op(op: VarlenOps) -> None:
    packed = _rows([5, 3])
    qkv = _qkv(packed, 2, 16)
    with pytest.raises(RuntimeError, match="contiguous float32"):
        torch.ops.srun_cpu.varlen_attention(qkv.double(), packed.starts, packed.lengths, 2, 0.3)
    with pytest.raises(RuntimeError, match="runs past"):
        torch.ops.srun_cpu.varlen_attention(qkv, packed.starts + 4, packed.lengths, 2, 0.3)
    with pytest.raises(RuntimeError, match="no kernel for head dim 12"):
        torch.ops.srun_cpu.varlen_attention(torch.zeros(8, 36), packed.starts, packed.lengths, 1, 0.3)


def test_a_head_size_without_a_kernel_or_another_dtype_runs_sdpa_per_run(op: VarlenOps) -> None:
    packed = _rows([6, 6, 3])
    qkv = _qkv(packed, 2, 12)  # head dim 12: no kernel
    assert not op.supports(12) and not op.supports(8)  # 8: no vector-wide kernel (slower than SDPA)
    assert torch.equal(op.attention(qkv, packed, 2), EAGER_OPS.attention(qkv, packed, 2))
    half = _qkv(packed, 2, 16).to(torch.bfloat16)
    assert torch.equal(op.attention(half, packed, 2), EAGER_OPS.attention(half, packed, 2))


def _norm(hidden: int, *, bias: bool = True, seed: int = 3) -> torch.nn.LayerNorm:
    norm = torch.nn.LayerNorm(hidden, eps=1e-12, bias=bias)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(hidden, generator=gen))
        if bias:
            norm.bias.copy_(torch.randn(hidden, generator=gen))
    return norm


@pytest.mark.parametrize("hidden", [384, 768, 40, 23])  # whole vectors, and widths with a scalar tail
def test_add_norm_in_one_pass_gives_eager_answers_row_by_row(op: VarlenOps, hidden: int) -> None:
    gen = torch.Generator().manual_seed(hidden)
    delta, residual = torch.randn(70, hidden, generator=gen) * 3, torch.randn(70, hidden, generator=gen)
    norm = _norm(hidden)
    want = EAGER_OPS.add_norm(delta, residual, norm)
    with torch.inference_mode():
        ours = op.add_norm(delta.clone(), residual, norm)
        threads = torch.get_num_threads()
        try:
            torch.set_num_threads(1)
            rows_alone = [op.add_norm(delta[i : i + 1].clone(), residual[i : i + 1], norm) for i in (0, 33, 69)]
            torch.set_num_threads(2)
            two = op.add_norm(delta.clone(), residual, norm)
        finally:
            torch.set_num_threads(threads)
    assert (ours - want).abs().max().item() < 1e-5
    assert torch.equal(two, ours)  # the thread count changes no bit
    assert all(torch.equal(alone[0], ours[i]) for alone, i in zip(rows_alone, (0, 33, 69)))  # nor the forward


def test_add_norm_keeps_eager_where_the_op_has_no_kernel(op: VarlenOps) -> None:
    delta, residual = torch.randn(9, 32), torch.randn(9, 32)
    cases = [
        (delta, residual, _norm(32, bias=False)),  # a norm without bias (ModernBERT)
        (delta.double(), residual.double(), _norm(32).double()),
        (delta.t().contiguous().t(), residual, _norm(32)),  # not contiguous
        (delta[:, None, :], residual[:, None, :], _norm(32)),  # not a matrix
    ]
    for d, r, norm in cases:
        kept = d.clone()
        with torch.inference_mode():
            out = op.add_norm(d, r, norm)
        assert torch.equal(out, EAGER_OPS.add_norm(kept, r, norm)) and torch.equal(d, kept)  # delta untouched
    with pytest.raises(RuntimeError, match="residual must be"):
        torch.ops.srun_cpu.add_layer_norm_(delta.clone(), residual[:4], torch.ones(32), torch.zeros(32), 1e-5)
    with pytest.raises(RuntimeError, match="weight and bias"):
        torch.ops.srun_cpu.add_layer_norm_(delta.clone(), residual, torch.ones(31), torch.zeros(32), 1e-5)


def test_the_op_is_built_once_per_cache_and_keyed_by_source_torch_and_cpu(tmp_path: Path) -> None:
    lines: list[str] = []
    env = {**os.environ, cpp_ops.CACHE_ENV: str(tmp_path)}
    assert load_varlen_attention(lines.append, env) is None
    built = cpu_op_library.OP.library_path(tmp_path)
    assert built.exists() and len(lines) == 1 and "building" in lines[0] and str(tmp_path) in lines[0]
    assert load_varlen_attention(lines.append, env) is None and len(lines) == 1  # loaded, not rebuilt
    assert [p.name for p in tmp_path.iterdir()] == [built.name]  # no temporary file left behind


def test_every_reason_not_to_use_it_keeps_per_run_attention_with_one_line(tmp_path: Path) -> None:
    lines: list[str] = []
    ops, card = cpu_ops(torch.float32, lines.append, {**os.environ, cpu_op_library.ENV: "0"})
    assert ops is EAGER_OPS and "VLLM_SRUN_CPU_ATTENTION=0" in card and len(lines) == 1
    lines.clear()
    no_compiler = {**os.environ, cpp_ops.CACHE_ENV: str(tmp_path / "empty"), "CXX": "/nonexistent/c++"}
    ops, card = cpu_ops(torch.float32, lines.append, no_compiler)
    assert ops is EAGER_OPS and "no C++ compiler" in card and len(lines) == 1 and "no C++ compiler" in lines[0]
    lines.clear()
    ops, card = cpu_ops(torch.bfloat16, lines.append)
    assert ops is EAGER_OPS and "FP32" in card and not lines
    lines.clear()
    broken = tmp_path / "broken"
    bad_compiler = {**os.environ, cpp_ops.CACHE_ENV: str(broken), "CXX": "false"}
    ops, card = cpu_ops(torch.float32, lines.append, bad_compiler)
    assert ops is EAGER_OPS and "could not build" in card
    assert [line for line in lines if line.startswith("load: attention per run")], lines


class _LayerLoop(VarlenOps):
    """The same ops with the layer loop in Python (no one-call stack)."""

    def layers(self, x, packed, blocks, linears):  # type: ignore[no-untyped-def]
        return None


class _Counted(VarlenOps):
    """The ops as shipped, counting the forwards whose layers ran in one call."""

    stacked = 0

    def layers(self, x, packed, blocks, linears):  # type: ignore[no-untyped-def]
        out = super().layers(x, packed, blocks, linears)
        self.stacked += out is not None
        return out


def test_the_layer_stack_in_one_call_gives_the_layer_loops_bits(op: VarlenOps, minilm_dir: Path) -> None:
    """`encoder_layers` runs every layer's kernels in the loop's order, so every row's hidden
    states are the loop's, bit for bit, whatever the forward; where a layer is not the plain
    packed shape (eager linears) it declines and the loop runs."""
    from vllm_srun.adapters.engines.cpu_onednn import PackedEncoder, onednn_unsupported
    from vllm_srun.adapters.models.encoder_arch import eager_linears, hidden_states
    from vllm_srun.adapters.models.reference_encoder import ReferenceEncoder
    from vllm_srun.adapters.models.tokenization import TextTokenizer
    from vllm_srun.adapters.models.unpadded import LayerLinears
    from vllm_srun.domain.worker.kernels import bucket_rows

    if onednn_unsupported("cpu", torch.float32) is not None:
        pytest.skip("no oneDNN packed linears in this torch build")
    reference = ReferenceEncoder.from_folder(minilm_dir)
    tokenizer = TextTokenizer.from_folder(minilm_dir)
    encoder = PackedEncoder(reference.encoder, reference.head)
    linears = [LayerLinears(x.qkv, x.attn_out, x.ffn_in, x.ffn_out) for x in encoder.layers]
    texts = [f"row {i} says " + "more words " * ((i * 7) % 40) for i in range(12)]  # 4 to 84 tokens
    loop, counted = _LayerLoop(), _Counted()
    with torch.inference_mode():
        for batch in (texts[:1], texts[:5], texts):
            rows = PackedRows.build(tokenizer.encode(batch, max_length=256), pad_to=bucket_rows)
            ours = hidden_states(reference.encoder, rows, linears, counted)
            theirs = hidden_states(reference.encoder, rows, linears, loop)
            assert torch.equal(ours[: rows.tokens], theirs[: rows.tokens])
        assert counted.stacked == 3  # every forward above ran its layers in one call
        ragged = PackedRows.build(tokenizer.encode(texts[:5], max_length=256))  # rows not padded to a bucket
        assert ragged.rows_total != bucket_rows(ragged.rows_total)
        ours = hidden_states(reference.encoder, ragged, linears, counted)
        assert counted.stacked == 3  # declined: the loop's linears pad each call to a bucket instead
        assert torch.equal(ours, hidden_states(reference.encoder, ragged, linears, loop))
        x = torch.zeros(rows.rows_total, reference.encoder.blocks[0].attn_norm.weight.shape[0])
        assert op.layers(x, rows, reference.encoder.blocks, eager_linears(reference.encoder)) is None


@pytest.fixture(scope="module")
def minilm_packed(minilm_dir: Path):  # type: ignore[no-untyped-def]
    """MiniLM's reference modules, its tokenizer and its oneDNN packed block linears."""
    from vllm_srun.adapters.engines.cpu_onednn import PackedEncoder, onednn_unsupported
    from vllm_srun.adapters.models.reference_encoder import ReferenceEncoder
    from vllm_srun.adapters.models.tokenization import TextTokenizer
    from vllm_srun.adapters.models.unpadded import LayerLinears

    if onednn_unsupported("cpu", torch.float32) is not None:
        pytest.skip("no oneDNN packed linears in this torch build")
    reference = ReferenceEncoder.from_folder(minilm_dir)
    packed = PackedEncoder(reference.encoder, reference.head)
    linears = [LayerLinears(x.qkv, x.attn_out, x.ffn_in, x.ffn_out) for x in packed.layers]
    return reference, TextTokenizer.from_folder(minilm_dir), packed, linears


def test_the_whole_forward_in_one_call_gives_the_loops_rows(op: VarlenOps, minilm_packed) -> None:  # type: ignore[no-untyped-def]
    """`srun_cpu::encode` (embeddings, `encoder_layers`, pooling, rows in the caller's order): each
    row's hidden states are the Python path's bits (PackedRows, the embeddings in torch, the layer
    loop), single texts and pairs (token types) alike; its cls rows are those bits, its means are the
    torch means to rounding, normalized when asked, and a row's answer is the same alone or in a crowd."""
    import torch.nn.functional as F

    from vllm_srun.adapters.models.encoder_arch import hidden_states
    from vllm_srun.domain.worker.kernels import bucket_rows

    reference, tokenizer, _, linears = minilm_packed
    encoder = reference.encoder
    texts = [f"entry {i} reads " + "further words " * ((i * 5) % 30) for i in range(12)]
    pairs = tokenizer.encode_pairs([(t, f"a second part {i}") for i, t in enumerate(texts[:6])], max_length=256)
    with torch.inference_mode():
        for batch in (
            tokenizer.encode(texts[:1], 256),
            tokenizer.encode(texts[:5], 256),
            tokenizer.encode(texts, 256),
            pairs,
        ):
            tokens = sum(len(r.ids) for r in batch)
            total = bucket_rows(tokens)
            rows = PackedRows.build(batch, pad_to=bucket_rows)
            assert (rows.types is not None) == (batch is pairs)
            want = hidden_states(encoder, rows, linears, _LayerLoop())
            got = op.encode(encoder, linears, batch, total, "none", False)
            assert got is not None and got.shape == (total, want.shape[1])
            starts = [0]
            for row in batch[:-1]:
                starts.append(starts[-1] + len(row.ids))
            for i, row in enumerate(batch):  # the caller's row i sits at sorted position rows.inverse[i]
                first = int(rows.starts[rows.inverse[i]])
                theirs = want[first : first + len(row.ids)]
                assert torch.equal(got[starts[i] : starts[i] + len(row.ids)], theirs), i
            cls = op.encode(encoder, linears, batch, total, "cls", False)
            assert torch.equal(cls, got[torch.tensor(starts)])
            mean = op.encode(encoder, linears, batch, total, "mean", False)
            means = torch.stack([got[s : s + len(r.ids)].mean(0) for s, r in zip(starts, batch)])
            assert (mean - means).abs().max().item() < 1e-6
            unit = op.encode(encoder, linears, batch, total, "mean", True)
            assert (unit - F.normalize(mean, dim=1)).abs().max().item() < 1e-6
            for i, row in enumerate(batch):
                alone = op.encode(encoder, linears, [row], bucket_rows(len(row.ids)), "mean", True)
                assert torch.equal(alone[0], unit[i]), i


def test_the_one_call_forward_declines_what_it_does_not_run_and_refuses_bad_rows(op: VarlenOps, minilm_packed) -> None:  # type: ignore[no-untyped-def]
    from vllm_srun.adapters.models.encoder_arch import EncoderModuleDefaults, eager_linears

    reference, tokenizer, _, linears = minilm_packed
    encoder = reference.encoder
    batch = tokenizer.encode(["a short text", "another one, a little longer than that"], 256)
    assert op.encode(encoder, linears, batch, 16, "mean", False) is not None
    assert op.encode(encoder, linears, batch, 17, "mean", False) is None  # not a row bucket
    assert op.encode(encoder, linears, batch, 16, "max", False) is None  # a pooling it does not have
    assert op.encode(encoder, eager_linears(encoder), batch, 16, "mean", False) is None  # not the packed copies
    # not BERT-shaped: an encoder module with no embedding tables (the declared default, no probing)
    assert op.encode(EncoderModuleDefaults(), linears, batch, 16, "mean", False) is None  # type: ignore[arg-type]
    assert EAGER_OPS.encode(encoder, linears, batch, 16, "mean", False) is None
    vocab = encoder.config.vocab_size
    with pytest.raises(RuntimeError, match="outside the vocabulary"):
        op.encode(encoder, linears, [Encoded([101, vocab, 102], [0, 0, 0], False, 3)], 16, "mean", False)
    too_long = encoder.config.max_position_embeddings + 1
    with pytest.raises(RuntimeError, match="positions of this model"):
        op.encode(encoder, linears, [Encoded([101] * too_long, [0] * too_long, False, too_long)], 1024, "mean", False)


def test_the_one_call_forward_takes_no_tensor_from_python() -> None:
    """The promise behind `encode` (no GIL taken in the call): its arguments are the held weights and
    plain integers, no tensor a Python object owns (each would be dropped, GIL held, as the op returns)."""
    schema = torch.ops.srun_cpu.encode.default._schema
    kinds = [str(arg.type) for arg in schema.arguments]
    assert kinds[0].endswith("srun_cpu.EncoderWeights") and "Tensor" not in " ".join(kinds), kinds


def test_the_engine_serves_embeddings_through_the_one_call_forward(op: VarlenOps, minilm_packed) -> None:  # type: ignore[no-untyped-def]
    from vllm_srun.adapters.engines.native import FORCED_UP_TO, NativeEncoder
    from vllm_srun.domain.worker.kernels import KernelPlan

    reference, tokenizer, packed, _ = minilm_packed

    class Counting(VarlenOps):
        calls = 0

        def encode(self, *args):  # type: ignore[no-untyped-def]
            out = super().encode(*args)
            self.calls += out is not None
            return out

    class Declining(VarlenOps):
        def encode(self, *args):  # type: ignore[no-untyped-def]
            return None

    counting = Counting()
    ours = NativeEncoder(reference, packed, KernelPlan(FORCED_UP_TO), ops=counting)
    theirs = NativeEncoder(reference, packed, KernelPlan(FORCED_UP_TO), ops=Declining())
    batch = tokenizer.encode([f"text number {i} " + "word " * i for i in range(7)], 256)
    got, want = ours.embed(batch), theirs.embed(batch)
    assert counting.calls == 1 and got.shape == want.shape and abs(got - want).max() < 1e-6


def test_every_other_output_takes_its_hidden_states_from_the_one_call_forward(op: VarlenOps, minilm_packed) -> None:  # type: ignore[no-untyped-def]
    """Poolings other than cls or mean and heads other than the packed BERT classifier read the hidden
    states: they come from one `encode` call (pooling none, rows passed in the packed rows' sorted
    order), laid out as the layer loop lays them and with its bits, real tokens and padding alike."""
    from vllm_srun.adapters.engines.native import FORCED_UP_TO, NativeEncoder
    from vllm_srun.adapters.models.encoder_arch import hidden_states
    from vllm_srun.domain.worker.kernels import KernelPlan

    reference, tokenizer, packed, _ = minilm_packed

    class Counting(VarlenOps):
        poolings: list[str] = []

        def encode(self, *args):  # type: ignore[no-untyped-def]
            out = super().encode(*args)
            if out is not None:
                self.poolings.append(args[4])
            return out

    counting = Counting()
    engine = NativeEncoder(reference, packed, KernelPlan(FORCED_UP_TO), ops=counting)
    batch = tokenizer.encode([f"row {i} says " + "more words " * ((i * 7) % 20) for i in range(9)], 256)
    with torch.inference_mode():
        chosen = engine._kernels(batch)
        hidden, rows = engine._hidden(batch, chosen)
        want = hidden_states(reference.encoder, rows, chosen[1], _LayerLoop())
    assert counting.poolings == ["none"]
    assert hidden.shape == want.shape and rows.rows_total > rows.tokens and torch.equal(hidden, want)


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one CPU: every loop runs on one thread anyway")
def test_the_ops_parallel_loops_run_on_the_forwards_threads(op: VarlenOps) -> None:
    """The library is built with OpenMP, so its `at::parallel_for` loops (the attention's (row,
    head) tasks, the gated delta rule's, the int8 rows') spread over the thread count a forward
    declares; built without it they all ran on the calling thread alone (a lone forward on two
    threads ran its attention on one), and on one declared thread they still do."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert torch.ops.srun_cpu.parallel_threads(64) == 2
        torch.set_num_threads(1)
        assert torch.ops.srun_cpu.parallel_threads(64) == 1
    finally:
        torch.set_num_threads(before)
