"""Our torch MPNet (`models/mpnet.py`) against `transformers` (test-only), on tiny random packages
written by the module's own fixture helpers (shared checks: `test_distilbert_parity.py`).

Checks: the relative position buckets (every distance up to past max_distance); the padded last
hidden state of a ragged batch; the unpadded serving forward (eager linears, oneDNN packed copies)
pooled per row against each row alone through transformers; logits (3 labels, 1 label) on both
paths; a config as transformers 5.x writes it and one with default fields left out; odd head sizes;
BF16 close to FP32; the ONNX export under ONNX Runtime; rows past 128 tokens (the log buckets' cap);
the one-call C++ attention with the relative bias, where this machine builds it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.integration.encoder_parity import (
    LENGTHS,
    check_bf16,
    check_embeddings,
    check_every_path,
    check_loads_the_same,
    check_logits,
    check_onnx,
    check_padded_hidden,
    hf_model,
    make_rows,
    serving_engines,
    write_fixture,
)
from vllm_srun.adapters.families.fixtures import mpnet_fixture
from vllm_srun.adapters.models import mpnet
from vllm_srun.adapters.models.bert import SequenceClassificationHead
from vllm_srun.adapters.models.tokenization import Encoded

transformers = pytest.importorskip("transformers")

BOS, PAD, EOS = 0, 1, 2  # MPNet's <s>, <pad>, </s>; rows never hold the pad id (positions skip it)
_package = partial(write_fixture, mpnet_fixture, PAD)  # (folder, num_labels, seed, edit, **sizes)


def _rows(seed: int = 0, lengths: Sequence[int] = LENGTHS) -> list[Encoded]:
    return make_rows(lengths, seed, first=BOS, last=EOS)


@pytest.fixture(scope="module")
def embedder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    folder = _package(tmp_path_factory.mktemp("mpnet") / "embed", None, positions=200)
    return folder, hf_model(folder, classify=False)


def test_relative_buckets_match_transformers() -> None:
    reference = transformers.models.mpnet.modeling_mpnet.MPNetEncoder.relative_position_bucket
    length = 600  # distances past max_distance 128 land in the last bucket of their side
    pos = torch.arange(length)
    want = reference(pos[None, :] - pos[:, None])
    got = mpnet.relative_buckets(length)
    assert torch.equal(got, want)
    assert got.min() == 0 and got.max() == 31 and len(got.unique()) == 31  # 16 (distance −0) never occurs


def test_fixture_is_what_transformers_builds(embedder) -> None:
    folder, hf = embedder
    assert type(hf).__name__ == "MPNetModel" and hf.config.hidden_size == 32
    encoder, head = mpnet.load_mpnet(folder)
    assert head is None and len(encoder.blocks) == 2  # MPNetModel's pooler is not a classification head
    assert encoder.config.max_tokens == 200 and encoder.config.max_position_embeddings == 202


def test_padded_hidden_state_matches(embedder) -> None:
    folder, hf = embedder
    encoder, _ = mpnet.load_mpnet(folder)
    check_padded_hidden(encoder, hf, _rows(), PAD)


def test_unpadded_serving_forward_matches_rows_alone(embedder) -> None:
    folder, hf = embedder
    check_embeddings(*mpnet.load_mpnet(folder), hf, _rows(1))


def test_rows_longer_than_the_bucket_range(embedder) -> None:
    """Rows of 150 and 180 tokens: distances past 128 share the last bucket."""
    folder, hf = embedder
    encoder, head = mpnet.load_mpnet(folder)
    rows = _rows(9, (180, 150, 150, 3))
    check_padded_hidden(encoder, hf, rows, PAD)
    check_embeddings(encoder, head, hf, rows)


@pytest.mark.parametrize("num_labels", [3, 1])
def test_classification_logits_match(tmp_path: Path, num_labels: int) -> None:
    folder = _package(tmp_path / "cls", num_labels, seed=num_labels)
    encoder, head = mpnet.load_mpnet(folder)
    assert isinstance(head, SequenceClassificationHead) and head.reads_first_token
    check_every_path(encoder, head, hf_model(folder, classify=True), _rows(2), PAD)


def _as_transformers5(config: dict[str, Any]) -> None:
    config["dtype"] = config.pop("torch_dtype")
    config.update(tie_word_embeddings=True, transformers_version="5.0.0")


def _defaults_left_out(config: dict[str, Any]) -> None:
    """Fields at transformers' defaults left out: pad/bos/eos ids, buckets, activation, eps."""
    for key in ("pad_token_id", "bos_token_id", "eos_token_id", "relative_attention_num_buckets", "hidden_act"):
        config.pop(key)
    config.pop("layer_norm_eps")  # transformers' default 1e-12, which the base package below writes


@pytest.mark.parametrize("edit", [_as_transformers5, _defaults_left_out])
def test_other_config_layouts_load_the_same(tmp_path: Path, edit: Callable[[dict], None]) -> None:
    def default_eps(config: dict[str, Any]) -> None:
        config["layer_norm_eps"] = 1e-12

    base = _package(tmp_path / "base", 3, seed=5, edit=default_eps)
    other = _package(tmp_path / "other", 3, seed=5, edit=lambda c: (default_eps(c), edit(c)))
    check_loads_the_same(mpnet.load_mpnet, base, other, _rows(3), PAD)


def test_a_pad_token_id_other_than_one_still_numbers_positions_past_one(tmp_path: Path) -> None:
    """transformers' MPNet numbers positions past padding_idx 1 whatever pad_token_id says."""
    folder = _package(tmp_path / "pad0", 2, seed=4, edit=lambda c: c.update(pad_token_id=0))
    encoder, head = mpnet.load_mpnet(folder)
    rows = make_rows(LENGTHS, 4, first=BOS, last=EOS)
    check_logits(encoder, head, hf_model(folder, classify=True), rows, 1)


@pytest.mark.parametrize("hidden,heads", [(24, 3), (24, 4)])  # head_dim 8 and 6
def test_odd_head_sizes(tmp_path: Path, hidden: int, heads: int) -> None:
    folder = _package(tmp_path / "odd", 2, hidden=hidden, heads=heads, intermediate=40)
    check_every_path(*mpnet.load_mpnet(folder), hf_model(folder, classify=True), _rows(5), PAD)


def test_bfloat16_is_close_to_fp32(tmp_path: Path) -> None:
    folder = _package(tmp_path / "bf16", 3, seed=6)
    check_bf16(mpnet.load_mpnet, folder, _rows(6), classify=True)


def test_onnx_export_matches(tmp_path: Path) -> None:
    folder = _package(tmp_path / "onnx", 3, seed=8)
    check_onnx(*mpnet.load_mpnet(folder), _rows(8), PAD, tmp_path / "m.onnx")


def test_unservable_configs_are_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match="num_attention_heads"):
        mpnet.MPNetConfig.from_dict({"model_type": "mpnet", "hidden_size": 30, "num_attention_heads": 4})
    with pytest.raises(ValueError, match="relative_attention_num_buckets"):
        mpnet.MPNetConfig.from_dict({"model_type": "mpnet", "relative_attention_num_buckets": 16})
    with pytest.raises(ValueError, match="hidden_act"):
        mpnet.MPNetConfig.from_dict({"model_type": "mpnet", "hidden_act": "mish"})


def test_the_one_call_forward_serves_mpnets_relative_bias(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Head sizes the C++ op has (16, 32): the whole forward runs in one C++ call (`srun_cpu::encode`,
    the relative bias a distance table held with the weights) and gives each row the bits of the
    Python layer loop on the biased attention op (spied); every path matches transformers on rows
    past the buckets' 128-token cap and across the op's 16-query blocks and 8-key groups."""
    from vllm_srun.adapters.engines.cpu_op_library import VarlenOps
    from vllm_srun.adapters.models.encoder_arch import hidden_states
    from vllm_srun.adapters.models.unpadded import PackedRows
    from vllm_srun.domain.worker.kernels import bucket_rows

    biased: list[int] = []
    plain_attention = VarlenOps.attention

    def spy(self, qkv, packed, heads, relative=None):  # type: ignore[no-untyped-def]
        if relative is not None and self.supports(qkv.shape[1] // (3 * heads)):
            biased.append(heads)
        return plain_attention(self, qkv, packed, heads, relative)

    monkeypatch.setattr(VarlenOps, "attention", spy)
    rows = _rows(11, (180, 150, 150, 33, 17, 16, 9, 3))
    for hidden, heads in ((32, 2), (64, 2)):  # head sizes 16 and 32
        folder = _package(tmp_path / f"h{hidden}", 3, hidden=hidden, heads=heads, intermediate=64, positions=200)
        encoder, head = mpnet.load_mpnet(folder)
        engines = serving_engines(encoder, head)
        if "unpadded-onednn-cpp" not in engines:
            pytest.skip("no C++ compiler or no oneDNN packed linears here")
        cpp = engines["unpadded-onednn-cpp"]
        total = bucket_rows(sum(len(r.ids) for r in rows))
        with torch.inference_mode():
            whole = cpp.ops.encode(encoder, cpp.packed_linears, rows, total, "none", False)
            packed = PackedRows.build(rows, pad_to=bucket_rows)
            before = len(biased)
            loop = hidden_states(encoder, packed, cpp.packed_linears, cpp.ops)
        assert whole is not None and len(biased) > before  # both paths ran, the loop on the biased op
        first = 0
        for i, row in enumerate(rows):  # the caller's row i sits at sorted position packed.inverse[i]
            start = int(packed.starts[packed.inverse[i]])
            assert torch.equal(whole[first : first + len(row.ids)], loop[start : start + len(row.ids)]), i
            first += len(row.ids)
        hf = hf_model(folder, classify=True)
        gaps = check_embeddings(encoder, head, hf, rows)
        check_logits(encoder, head, hf, rows, PAD)
        assert "unpadded-onednn-cpp" in gaps
