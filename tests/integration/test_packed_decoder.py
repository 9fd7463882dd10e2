"""The decision family's packed CPU decoder engine (`engines/packed_decoder.py`): its logits equal the
eager engine's and transformers', a row's bits do not depend on its neighbours, the card names the
kernels, and where it cannot run the eager engine serves with the reason on the card."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from tests.fakes import FakeDevice
from vllm_srun.adapters.contracts import Determinism, as_decoder_engine
from vllm_srun.adapters.engines.native_decoder import NativeDecoder, native_decoder
from vllm_srun.adapters.engines.packed_decoder import PackedDecoder, eager_logits, packed_decoder
from vllm_srun.adapters.models.answer_logits import pick
from vllm_srun.adapters.models.decoder import DecoderLM
from vllm_srun.domain.scheduling.lanes import Accounting

TOL = 1e-5  # packed against eager, relative to the logits' size (as the encoders' NUMERICS_TOL)
ROWS_LENGTHS = (5, 17, 1, 9, 9, 30, 2)


def _rows(vocab: int, lengths: tuple[int, ...] = ROWS_LENGTHS, seed: int = 3) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]


def _packed(folder: Path, lines: list[str] | None = None) -> PackedDecoder:
    lm = DecoderLM.from_pretrained(folder)
    engine = packed_decoder(lm, (lines if lines is not None else []).append, {})
    assert isinstance(engine, PackedDecoder), engine
    return engine


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def engine(request: Any, decision_fixture: Any) -> PackedDecoder:
    return _packed(decision_fixture(request.param))


def test_packed_logits_equal_the_eager_engines(engine: PackedDecoder) -> None:
    rows = _rows(engine.vocab_size)
    got = engine.logits_at(rows)
    eager = NativeDecoder(engine.lm).logits_at(rows)  # today's engine: right-padded, eager torch
    assert got.shape == (len(rows), engine.vocab_size)
    gap = float((got - eager).abs().max()) / max(1.0, float(eager.abs().max()))
    assert gap <= TOL, gap
    # and each row's logits are those of its own last token: a row cut short gets other logits
    shorter = engine.logits_at([r[:-1] for r in rows if len(r) > 1])
    assert not torch.allclose(shorter, got[[i for i, r in enumerate(rows) if len(r) > 1]], atol=1e-3)


def test_a_row_gets_the_same_bits_alone_and_in_any_batch(engine: PackedDecoder) -> None:
    """Each row's last hidden state (what its answer logits are computed from, the test below)."""
    rows = _rows(engine.vocab_size)
    mixed = engine.hidden_last(rows)
    for i, row in enumerate(rows):
        assert torch.equal(engine.hidden_last([row])[0], mixed[i]), i
    reordered = engine.hidden_last(rows[::-1] + _rows(engine.vocab_size, (40, 3), seed=9))
    assert torch.equal(reordered[: len(rows)], mixed.flip(0))


def _answers(vocab: int, rows: int, seed: int = 5) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randperm(vocab, generator=gen)[: 2 + r % 4].tolist() for r in range(rows)]


def test_answer_logits_are_the_full_logits_at_the_answer_tokens(engine: PackedDecoder) -> None:
    rows = _rows(engine.vocab_size)
    tokens = _answers(engine.vocab_size, len(rows))
    got = engine.answer_logits(rows, tokens)
    assert got.shape == (sum(len(t) for t in tokens),) and got.dtype == torch.float32
    want = pick(NativeDecoder(engine.lm).logits_at(rows), tokens)  # the eager engine, every row computed
    gap = float((got - want).abs().max()) / max(1.0, float(want.abs().max()))
    assert gap <= TOL, gap
    torch.testing.assert_close(got, pick(engine.logits_at(rows), tokens), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="answer sets"):
        engine.answer_logits(rows, tokens[:-1])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.answer_logits(rows[:1], [[0, engine.vocab_size]])


def test_a_rows_answer_logits_have_the_same_bits_alone_in_any_batch_and_at_any_thread_count(
    engine: PackedDecoder,
) -> None:
    rows = _rows(engine.vocab_size)
    tokens = _answers(engine.vocab_size, len(rows))
    mixed = engine.answer_logits(rows, tokens)
    start = 0
    for row, ids in zip(rows, tokens, strict=True):
        assert torch.equal(engine.answer_logits([row], [ids]), mixed[start : start + len(ids)]), row
        start += len(ids)
    more = _rows(engine.vocab_size, (40, 3), seed=9)
    other = engine.answer_logits(rows[::-1] + more, tokens[::-1] + _answers(engine.vocab_size, 2, seed=1))
    assert torch.equal(
        other[: len(mixed)],
        torch.cat([engine.answer_logits([r], [t]) for r, t in zip(rows[::-1], tokens[::-1], strict=True)]),
    )
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = engine.answer_logits(rows, tokens)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(alone, mixed)


def test_the_engine_holds_no_copy_of_the_output_layer(engine: PackedDecoder) -> None:
    lm = engine.lm
    weight = lm.model.embed_tokens.weight if lm.lm_head is None else lm.lm_head.weight
    assert engine.output_weight.data_ptr() == weight.data_ptr()
    assert not hasattr(engine, "head")


def test_the_card_names_the_kernels_and_the_engine_is_packed_and_batch_invariant(decision_fixture: Any) -> None:
    lines: list[str] = []
    lm = DecoderLM.from_pretrained(decision_fixture("qwen3"))
    engine = as_decoder_engine(native_decoder(lm, FakeDevice(kind="cpu"), lines.append, {}))
    assert isinstance(engine, PackedDecoder)
    assert engine.accounting is Accounting.PACKED and engine.determinism is Determinism.BATCH_INVARIANT
    assert engine.kernel_switch_tokens is None
    kernels = engine.describe()["kernels"]
    assert kernels["linear"] == "onednn_packed" and kernels["dtype"] == "float32"
    assert "one C++ call" in kernels["layers"] and "last token" in kernels["output_layer"]
    assert kernels["numerics_gap"] <= TOL
    # the load says what it packs (the encoders' progress lines)
    assert any("packing 2 decoder layers" in line for line in lines), lines
    assert any("one C++ call" in line for line in lines)
    assert "answer tokens only" in kernels["output_layer"]


@pytest.mark.parametrize(
    ("env", "dtype", "why"),
    [
        ({"VLLM_SRUN_ONEDNN": "0"}, torch.float32, "turned off (VLLM_SRUN_ONEDNN=0)"),
        ({}, torch.bfloat16, "bfloat16"),
    ],
)
def test_where_it_cannot_run_the_eager_engine_serves_and_says_why(
    decision_fixture: Any, env: dict[str, str], dtype: torch.dtype, why: str
) -> None:
    lm = DecoderLM.from_pretrained(decision_fixture("llama"), dtype=dtype)
    lines: list[str] = []
    engine = native_decoder(lm, FakeDevice(kind="cpu"), lines.append, env)
    assert isinstance(engine, NativeDecoder) and engine.determinism is Determinism.ROWS_ALONE
    assert engine.accounting is Accounting.PADDED
    kernels = engine.describe()["kernels"]
    assert kernels["linear"] == "eager" and why in kernels["reason"]
    assert any("eager decoder kernels" in line and why in line for line in lines), lines


def test_the_stack_runs_the_rows_so_a_broken_layer_shows(decision_fixture: Any) -> None:
    """The packed forward reads the layers' own weights: disturbing one changes the answers, and
    the load-time check then refuses the packed copies made before it (they no longer agree)."""
    engine = _packed(decision_fixture("llama"))
    rows = _rows(engine.vocab_size)
    before = engine.logits_at(rows)
    with torch.no_grad():
        engine.lm.model.blocks[0].mlp.down_proj.weight.mul_(3.0)  # eager sees it; the packed copy does not
    assert not torch.allclose(eager_logits(engine.lm, rows), before, atol=1e-3)
    from vllm_srun.adapters.engines.packed_decoder import numerics_gap

    assert numerics_gap(engine) > TOL


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_packed_logits_equal_transformers(kind: str, tmp_path: Path) -> None:
    config_name, model_name = {
        "llama": ("LlamaConfig", "LlamaForCausalLM"),
        "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    }[kind]
    torch.manual_seed(0)
    config = getattr(transformers, config_name)(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,  # heads x head size (128) is not the hidden size, as in Qwen3-0.6B
        max_position_embeddings=256,
        tie_word_embeddings=kind == "qwen3",
    )
    ref = getattr(transformers, model_name)(config).eval()
    with torch.no_grad():  # norms at 1 would hide mistakes: disturb everything
        for p in ref.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    ref.save_pretrained(tmp_path)
    engine = _packed(tmp_path)
    rows = _rows(96)
    got = engine.logits_at(rows)
    for i, row in enumerate(rows):
        with torch.no_grad():
            want = ref(torch.tensor([row])).logits[0, -1]
        torch.testing.assert_close(got[i], want, atol=1e-4, rtol=0)  # test_decoder_parity.py's tolerance
