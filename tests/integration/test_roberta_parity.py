"""RoBERTa and XLM-RoBERTa through our BERT encoder (`models/bert.py`) against `transformers`
(test-only), on tiny random packages from `families/fixtures/roberta_fixture.py` (shared checks:
`test_distilbert_parity.py`).

Checks, for model_type `roberta` and `xlm-roberta` (one token type, positions past pad_token_id):
the padded last hidden state of a ragged batch; the unpadded serving forward (eager linears, oneDNN
packed copies) pooled per row against each row alone through transformers; logits with 3 labels
and 1 label on both paths; config.json as transformers 4.x writes it (`position_embedding_type`)
and as 5.x does (no such field, `dtype`), and with pad_token_id left out (RoBERTa's default is 1,
not BERT's 0); odd head sizes; BF16 close to FP32; the ONNX export under ONNX Runtime.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

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
    write_fixture,
)
from vllm_srun.adapters.families.fixtures import roberta_fixture
from vllm_srun.adapters.models.bert import BertConfig, SequenceClassificationHead, load_bert
from vllm_srun.adapters.models.tokenization import Encoded

transformers = pytest.importorskip("transformers")

BOS, PAD, EOS = 0, 1, 2  # <s>, <pad>, </s>; rows never hold the pad id (positions skip it)
TYPES = ("roberta", "xlm-roberta")


def _package(
    folder: Path,
    model_type: str,
    num_labels: int | None,
    seed: int = 0,
    edit: Callable[[dict], None] | None = None,
    **sizes: int,
) -> Path:
    return write_fixture(roberta_fixture, PAD, folder, num_labels, seed, edit, model_type=model_type, **sizes)


def _rows(seed: int = 0, lengths: Sequence[int] = LENGTHS) -> list[Encoded]:
    return make_rows(lengths, seed, first=BOS, last=EOS)


@pytest.fixture(scope="module", params=TYPES)
def embedder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, Any]:
    folder = _package(tmp_path_factory.mktemp(request.param) / "embed", request.param, None)
    return request.param, folder, hf_model(folder, classify=False)


def test_fixture_is_what_transformers_builds(embedder) -> None:
    model_type, folder, hf = embedder
    expected = {"roberta": "RobertaModel", "xlm-roberta": "XLMRobertaModel"}[model_type]
    assert type(hf).__name__ == expected and hf.config.type_vocab_size == 1
    encoder, head = load_bert(folder)
    assert head is None  # the bare model's pooler is not a classification head
    cfg = encoder.config
    assert cfg.model_type == model_type and cfg.position_offset == 2 and cfg.max_tokens == 128


def test_padded_hidden_state_matches(embedder) -> None:
    _, folder, hf = embedder
    encoder, _ = load_bert(folder)
    check_padded_hidden(encoder, hf, _rows(), PAD)


def test_unpadded_serving_forward_matches_rows_alone(embedder) -> None:
    _, folder, hf = embedder
    check_embeddings(*load_bert(folder), hf, _rows(1))


@pytest.mark.parametrize("model_type", TYPES)
@pytest.mark.parametrize("num_labels", [3, 1])
def test_classification_logits_match(tmp_path: Path, model_type: str, num_labels: int) -> None:
    folder = _package(tmp_path / "cls", model_type, num_labels, seed=num_labels)
    encoder, head = load_bert(folder)
    assert isinstance(head, SequenceClassificationHead) and encoder.config.num_labels == num_labels
    check_every_path(encoder, head, hf_model(folder, classify=True), _rows(2), PAD)


def _as_transformers5(config: dict[str, Any]) -> None:
    """transformers 5.x: no `position_embedding_type` (absolute only), `dtype` for `torch_dtype`."""
    config.pop("position_embedding_type")
    config["dtype"] = config.pop("torch_dtype")
    config.update(add_cross_attention=False, is_decoder=False, tie_word_embeddings=True, transformers_version="5.0.0")


def _pad_left_out(config: dict[str, Any]) -> None:
    """pad/bos/eos ids left out: RoBERTa's defaults (1, 0, 2) apply, so positions still start at 2."""
    for key in ("pad_token_id", "bos_token_id", "eos_token_id", "position_embedding_type", "torch_dtype"):
        config.pop(key)


def _position_type_null(config: dict[str, Any]) -> None:
    config["position_embedding_type"] = None


@pytest.mark.parametrize("model_type", TYPES)
@pytest.mark.parametrize("edit", [_as_transformers5, _pad_left_out, _position_type_null])
def test_other_config_layouts_load_the_same(tmp_path: Path, model_type: str, edit: Callable[[dict], None]) -> None:
    base = _package(tmp_path / "base", model_type, 3, seed=5)
    other = _package(tmp_path / "other", model_type, 3, seed=5, edit=edit)
    encoder, _ = check_loads_the_same(load_bert, base, other, _rows(3), PAD)
    assert encoder.config.pad_token_id == PAD and encoder.config.position_offset == 2


def test_bert_defaults_stay_bert() -> None:
    cfg = BertConfig.from_dict({"model_type": "bert"})
    assert cfg.pad_token_id == 0 and cfg.position_offset == 0 and cfg.labels == ["LABEL_0", "LABEL_1"]
    cfg = BertConfig.from_dict({"model_type": "xlm-roberta", "num_labels": 1, "max_position_embeddings": 514})
    assert cfg.pad_token_id == 1 and cfg.max_tokens == 512 and cfg.labels == ["LABEL_0"]


def test_unservable_configs_are_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match="position_embedding_type"):
        BertConfig.from_dict({"model_type": "roberta", "position_embedding_type": "relative_key"})
    with pytest.raises(ValueError, match="num_attention_heads"):
        BertConfig.from_dict({"model_type": "roberta", "hidden_size": 30, "num_attention_heads": 4})
    with pytest.raises(ValueError, match="max_position_embeddings"):
        BertConfig.from_dict({"model_type": "roberta", "max_position_embeddings": 2})
    with pytest.raises(ValueError, match="model_type"):
        roberta_fixture.fixture_config(VOCAB, PAD, None, model_type="bert")


@pytest.mark.parametrize("hidden,heads", [(24, 3), (24, 4)])  # head_dim 8 and 6
def test_odd_head_sizes(tmp_path: Path, hidden: int, heads: int) -> None:
    folder = _package(tmp_path / "odd", "xlm-roberta", 2, hidden=hidden, heads=heads, intermediate=40)
    check_every_path(*load_bert(folder), hf_model(folder, classify=True), _rows(5), PAD)


@pytest.mark.parametrize("model_type", TYPES)
def test_the_one_call_cpu_forward_matches(tmp_path: Path, model_type: str) -> None:
    """Head size 16: the C++ ops run the whole forward in one call (offset positions included)."""
    folder = _package(tmp_path / "wide", model_type, 3, seed=9, hidden=64, heads=4, intermediate=96)
    check_one_call_forward(*load_bert(folder), hf_model(folder, classify=True), _rows(9), PAD)


def test_bfloat16_is_close_to_fp32(tmp_path: Path) -> None:
    folder = _package(tmp_path / "bf16", "roberta", 3, seed=6)
    check_bf16(load_bert, folder, _rows(6), classify=True)


@pytest.mark.parametrize("model_type", TYPES)
def test_onnx_export_matches(tmp_path: Path, model_type: str) -> None:
    folder = _package(tmp_path / "onnx", model_type, 3, seed=8)
    check_onnx(*load_bert(folder), _rows(8), PAD, tmp_path / "m.onnx")
