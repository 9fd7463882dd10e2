"""Our torch DistilBERT (`models/distilbert.py`) against `transformers` (test-only), on tiny random
packages written by the module's own fixture helpers.

Checks: the padded last hidden state of a ragged batch; the unpadded serving forward
(`NativeEncoder`: eager linears, and the oneDNN packed copies) pooled per row against each row run
alone through transformers; classification logits (3 labels, 1 label) on both paths; a config
laid out as transformers 5.x writes it (and one with default fields left out); a sinusoidal
table left out of the checkpoint; odd head sizes (head_dim 8 and 6); BF16 close to FP32; the
ONNX export under ONNX Runtime.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.integration.encoder_parity import (
    LENGTHS,
    VOCAB,
    check_bf16,
    check_embeddings,
    check_every_path,
    check_loads_the_same,
    check_one_call_forward,
    check_onnx,
    check_padded_hidden,
    hf_model,
    make_rows,
    max_diff,
    serving_engines,
    write_fixture,
    write_package,
)
from vllm_srun.adapters.families.fixtures import distilbert_fixture
from vllm_srun.adapters.models import distilbert
from vllm_srun.adapters.models.tokenization import Encoded

transformers = pytest.importorskip("transformers")

CLS, SEP, PAD = 1, 2, 0
_package = partial(write_fixture, distilbert_fixture, PAD)  # (folder, num_labels, seed, edit, **sizes)


def _rows(seed: int = 0, lengths: Sequence[int] = LENGTHS) -> list[Encoded]:
    return make_rows(lengths, seed, first=CLS, last=SEP)


@pytest.fixture(scope="module")
def embedder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    folder = _package(tmp_path_factory.mktemp("distilbert") / "embed", None)
    return folder, hf_model(folder, classify=False)


def test_fixture_is_what_transformers_builds(embedder) -> None:
    folder, hf = embedder
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["DistilBertModel"] and config["torch_dtype"] == "float32"
    assert type(hf).__name__ == "DistilBertModel" and hf.config.dim == 32 and hf.config.n_heads == 4
    encoder, head = distilbert.load_distilbert(folder)
    assert head is None and len(encoder.blocks) == 2
    assert encoder.config.max_tokens == 128 and encoder.config.labels == ["LABEL_0", "LABEL_1"]


def test_padded_hidden_state_matches(embedder) -> None:
    folder, hf = embedder
    encoder, _ = distilbert.load_distilbert(folder)
    check_padded_hidden(encoder, hf, _rows(), PAD)


def test_unpadded_serving_forward_matches_rows_alone(embedder) -> None:
    folder, hf = embedder
    check_embeddings(*distilbert.load_distilbert(folder), hf, _rows(1))


@pytest.mark.parametrize("num_labels", [3, 1])
def test_classification_logits_match(tmp_path: Path, num_labels: int) -> None:
    folder = _package(tmp_path / "cls", num_labels, seed=num_labels)
    encoder, head = distilbert.load_distilbert(folder)
    assert isinstance(head, distilbert.DistilBertClassificationHead) and head.reads_first_token
    check_every_path(encoder, head, hf_model(folder, classify=True), _rows(2), PAD)


def _as_transformers5(config: dict[str, Any]) -> None:
    """transformers 5.x's layout: `dtype`, bos/eos ids, `tie_word_embeddings`, no `tie_weights_`."""
    config["dtype"] = config.pop("torch_dtype")
    config.pop("tie_weights_")
    config.update(bos_token_id=None, eos_token_id=None, tie_word_embeddings=True, transformers_version="5.0.0")


def _defaults_left_out(config: dict[str, Any]) -> None:
    """An older config: fields at their default left out (activation, pad id, sinusoidal flag)."""
    for key in ("activation", "pad_token_id", "sinusoidal_pos_embds", "torch_dtype", "tie_weights_"):
        config.pop(key)


@pytest.mark.parametrize("edit", [_as_transformers5, _defaults_left_out])
def test_other_config_layouts_load_the_same(tmp_path: Path, edit: Callable[[dict], None]) -> None:
    base = _package(tmp_path / "base", 3, seed=5)
    other = _package(tmp_path / "other", 3, seed=5, edit=edit)
    check_loads_the_same(distilbert.load_distilbert, base, other, _rows(3), PAD)


def test_sinusoidal_table_left_out_is_rebuilt(tmp_path: Path) -> None:
    """A `sinusoidal_pos_embds` checkpoint without its table: we build the one transformers builds."""
    config = distilbert_fixture.fixture_config(VOCAB, PAD, None)
    config["sinusoidal_pos_embds"] = True
    weights = distilbert_fixture.fixture_weights(config, None, 7)
    full = write_package(tmp_path / "full", config, weights)
    table = weights.pop("embeddings.position_embeddings.weight")
    assert np.abs(table).max() <= 1.0 and abs(float(table[1, 0]) - np.sin(1.0)) < 1e-6
    folder = write_package(tmp_path / "bare", config, weights)
    hf = transformers.AutoModel.from_pretrained(folder, attn_implementation="eager").eval()
    assert max_diff(hf.embeddings.position_embeddings.weight, table) < 1e-6
    encoder, _ = distilbert.load_distilbert(folder)
    check_padded_hidden(encoder, hf, _rows(4), PAD)
    assert torch.equal(
        encoder.embeddings.position_embeddings.weight,
        distilbert.load_distilbert(full)[0].embeddings.position_embeddings.weight,
    )


@pytest.mark.parametrize("hidden,heads", [(24, 3), (24, 4)])  # head_dim 8 and 6
def test_odd_head_sizes(tmp_path: Path, hidden: int, heads: int) -> None:
    folder = _package(tmp_path / "odd", 2, hidden=hidden, heads=heads, intermediate=40)
    check_every_path(*distilbert.load_distilbert(folder), hf_model(folder, classify=True), _rows(5), PAD)


def test_the_one_call_cpu_forward_matches(tmp_path: Path) -> None:
    """Head size 16: the C++ ops run the whole forward in one call (no token types)."""
    folder = _package(tmp_path / "wide", 3, seed=9, hidden=64, heads=4, intermediate=96)
    encoder, head = distilbert.load_distilbert(folder)
    check_one_call_forward(encoder, head, hf_model(folder, classify=True), _rows(9), PAD)
    cpp = serving_engines(encoder, head)["unpadded-onednn-cpp"]
    rows = _rows(9)
    typed = [Encoded(r.ids, [i % 2] * len(r.ids), r.truncated, r.n_tokens) for i, r in enumerate(rows)]
    assert np.array_equal(cpp.embed(typed), cpp.embed(rows))  # type ids are not DistilBERT's: ignored


def test_bfloat16_is_close_to_fp32(tmp_path: Path) -> None:
    folder = _package(tmp_path / "bf16", 3, seed=6)
    check_bf16(distilbert.load_distilbert, folder, _rows(6), classify=True)


def test_onnx_export_matches(tmp_path: Path) -> None:
    folder = _package(tmp_path / "onnx", 3, seed=8)
    check_onnx(*distilbert.load_distilbert(folder), _rows(8), PAD, tmp_path / "m.onnx")


def test_unservable_configs_are_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match="n_heads"):
        distilbert.DistilBertConfig.from_dict({"model_type": "distilbert", "dim": 30, "n_heads": 4})
    with pytest.raises(ValueError, match="activation"):
        distilbert.DistilBertConfig.from_dict({"model_type": "distilbert", "activation": "mish"})
