"""Our torch DeBERTa-v2 encoder (`models/deberta_v2.py`) against `transformers` (test-only dependency).

Tiny random packages written by the module's own fixture helpers, in three styles: DeBERTa-v3-like
(no absolute positions, shared position keys, log buckets, normed relative embeddings), an older
v2-like one (absolute positions, own position projections, no buckets, "c2p|p2c"), and a
v2-xlarge-like one (ConvLayer, `embedding_size` ≠ hidden, token types). Rows reach past the buckets
(40 tokens, buckets 16, relative positions clamped at 32), so bucketing and clamping are exercised.
Checked within 1e-5: the padded hidden state on a ragged masked batch, the unpadded forward
(`NativeEncoder`, eager and oneDNN packed linears) against each row alone, classification logits
(3 labels and 1), configs written the other transformers version's way, odd head sizes; BF16 close
to FP32; the ONNX export within 1e-4.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import save_file

from tests.integration.encoder_parity import LayerLoop, serving_engines, spy_stacks
from vllm_srun.adapters.engines.cpu_onednn import PackedEncoder, onednn_unsupported
from vllm_srun.adapters.engines.native import FORCED_UP_TO, NativeEncoder
from vllm_srun.adapters.families.fixtures.deberta_v2_fixture import fixture_config, fixture_weights
from vllm_srun.adapters.models.deberta_v2 import DebertaV2ClassificationHead, DebertaV2Encoder, load_deberta_v2
from vllm_srun.adapters.models.deberta_v2_config import DebertaV2Config, log_bucket
from vllm_srun.adapters.models.encoders import load_encoder
from vllm_srun.adapters.models.pooling import PoolingConfig
from vllm_srun.adapters.models.reference_encoder import ReferenceEncoder
from vllm_srun.adapters.models.tokenization import Encoded
from vllm_srun.adapters.models.weights import WeightsError
from vllm_srun.domain.worker.kernels import KernelPlan

TOL = 1e-5
VOCAB = 100
STYLES: dict[str, dict[str, Any]] = {
    # DeBERTa-v3 / mDeBERTa: position_biased_input false, share_att_key, buckets, norm_rel_ebd layer_norm
    "v3": {"style": "v3", "position_buckets": 16, "max_relative_positions": 32},
    # older v2: absolute positions, pos_key_proj / pos_query_proj, no position_buckets field at all
    "v2": {"style": "v2", "max_relative_positions": 16},
    # v2-xlarge-like: ConvLayer after the first block, embed_proj, token types
    "conv": {
        "style": "v3",
        "position_buckets": 16,
        "max_relative_positions": 32,
        "conv_kernel_size": 3,
        "conv_act": "gelu",
        "embedding_size": 24,
        "type_vocab_size": 2,
    },
}
LENGTHS = [7, 40, 1, 20, 7, 3, 33]  # two of equal length; 40 > every bucket window and span


def _package(
    folder: Path, style: str, num_labels: int | None, seed: int = 0, sizes: dict[str, int] | None = None
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config = fixture_config(VOCAB, 0, num_labels, **(sizes or {}), **STYLES[style])
    (folder / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    save_file(fixture_weights(config, num_labels, seed), str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def _rows(lengths: list[int], seed: int = 1, types: bool = True) -> list[Encoded]:
    """Rows of random ids (never the pad id 0); a second segment of type 1 in the longer ones."""
    rng = np.random.default_rng(seed)
    rows = []
    for n in lengths:
        ids = rng.integers(1, VOCAB, n).tolist()
        type_ids = [0] * (n - n // 3) + [1] * (n // 3) if types else [0] * n
        rows.append(Encoded(ids, type_ids, False, n))
    return rows


def _padded(rows: list[Encoded]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    t = max(len(r.ids) for r in rows)
    ids = torch.tensor([[*r.ids, *[0] * (t - len(r.ids))] for r in rows])
    types = torch.tensor([[*r.type_ids, *[0] * (t - len(r.ids))] for r in rows])
    mask = torch.arange(t)[None, :] < torch.tensor([len(r.ids) for r in rows])[:, None]
    return ids, mask, types


def _theirs(folder: Path, head: bool) -> torch.nn.Module:
    auto = transformers.AutoModelForSequenceClassification if head else transformers.AutoModel
    model, info = auto.from_pretrained(folder, attn_implementation="eager", output_loading_info=True)
    assert not any(info.values()), info  # the fixture names every tensor exactly as transformers does
    return model.eval()


def _alone(model: torch.nn.Module, rows: list[Encoded]) -> tuple[np.ndarray, np.ndarray | None]:
    """Each row run alone through transformers: mean-pooled hidden state (and logits for a classifier)."""
    means, logits = [], []
    base = model.deberta if hasattr(model, "deberta") else model
    with torch.no_grad():
        for r in rows:
            ids, types = torch.tensor([list(r.ids)]), torch.tensor([list(r.type_ids)])
            means.append(base(input_ids=ids, token_type_ids=types).last_hidden_state[0].mean(0).numpy())
            if base is not model:
                logits.append(model(input_ids=ids, token_type_ids=types).logits[0].numpy())
    return np.stack(means), np.stack(logits) if logits else None


def _engines(folder: Path, dtype: torch.dtype = torch.float32) -> dict[str, NativeEncoder]:
    encoder, head = load_deberta_v2(folder, dtype)
    ref = ReferenceEncoder(encoder, head, PoolingConfig(("mean",)))
    engines = {"eager": NativeEncoder(ref)}
    if onednn_unsupported("cpu", dtype) is None:
        engines["onednn"] = NativeEncoder(ref, PackedEncoder(encoder, head), KernelPlan(FORCED_UP_TO))
    return engines


def _gap(got: np.ndarray | torch.Tensor, want: np.ndarray | torch.Tensor) -> float:
    return float(np.abs(np.asarray(got) - np.asarray(want)).max())


@pytest.mark.parametrize("style", sorted(STYLES))
def test_padded_hidden_state_matches_transformers(tmp_path: Path, style: str) -> None:
    folder = _package(tmp_path / style, style, None)
    theirs = _theirs(folder, head=False)
    encoder, head = load_deberta_v2(folder)
    assert isinstance(encoder, DebertaV2Encoder) and head is None
    ids, mask, types = _padded(_rows(LENGTHS))
    with torch.no_grad():
        want = theirs(input_ids=ids, attention_mask=mask.long(), token_type_ids=types).last_hidden_state
        got = encoder(ids, mask, types)
        full = encoder(ids[:, :7], None, types[:, :7])  # every row 7 long: no mask at all
        want_full = theirs(input_ids=ids[:, :7], token_type_ids=types[:, :7]).last_hidden_state
    assert want[mask].std() > 0.5  # a real signal
    assert _gap(got[mask], want[mask]) < TOL
    assert _gap(full, want_full) < TOL
    if style == "conv":  # token types matter there (type_vocab_size 2), are ignored elsewhere
        with torch.no_grad():
            assert _gap(encoder(ids, mask, None)[mask], want[mask]) > 1e-3


@pytest.mark.parametrize("path", ["eager", "onednn"])
@pytest.mark.parametrize("style", sorted(STYLES))
def test_unpadded_embeddings_match_each_row_alone(tmp_path: Path, style: str, path: str) -> None:
    if path == "onednn" and (why := onednn_unsupported("cpu", torch.float32)) is not None:
        pytest.skip(f"oneDNN packed linears: {why}")
    folder = _package(tmp_path / style, style, None, seed=3)
    rows = _rows(LENGTHS, seed=4)
    want, _ = _alone(_theirs(folder, head=False), rows)
    engine = _engines(folder)[path]
    got = engine.embed(rows)
    assert got.shape == (len(rows), 32) and got.dtype == np.float32
    assert _gap(got, want) < TOL
    assert _gap(np.concatenate([engine.embed([r]) for r in rows[:3]]), want[:3]) < TOL


@pytest.mark.parametrize("num_labels", [3, 1])
@pytest.mark.parametrize("style", ["v3", "v2", "conv"])
def test_classification_logits_match_transformers(tmp_path: Path, style: str, num_labels: int) -> None:
    folder = _package(tmp_path / style, style, num_labels, seed=7)
    theirs = _theirs(folder, head=True)
    rows = _rows(LENGTHS, seed=8)
    _, want = _alone(theirs, rows)
    assert want is not None and want.shape == (len(rows), num_labels) and want.std() > 1e-2
    encoder, head = load_deberta_v2(folder)
    assert isinstance(head, DebertaV2ClassificationHead) and head.reads_first_token
    assert encoder.config.labels == [f"LABEL_{i}" for i in range(num_labels)]
    for name, engine in _engines(folder).items():
        assert _gap(engine.classify_logits(rows), want) < TOL, name
    # the padded path (ReferenceEncoder, the ONNX export's maths) against transformers' padded batch
    ids, mask, types = _padded(rows)
    with torch.no_grad():
        padded_want = theirs(input_ids=ids, attention_mask=mask.long(), token_type_ids=types).logits.numpy()
    assert _gap(padded_want, want) < TOL
    assert _gap(ReferenceEncoder(encoder, head, PoolingConfig(("cls",))).classify_logits(rows), want) < TOL


def _as_5x(config: dict[str, Any]) -> dict[str, Any]:
    """What transformers 5.x's save_pretrained writes: `dtype`, tie_word_embeddings, list pos_att_type."""
    out = {k: v for k, v in config.items() if k != "torch_dtype"}
    pos = out.get("pos_att_type")
    if isinstance(pos, str):
        out["pos_att_type"] = [x.strip() for x in pos.split("|")]
    return out | {"dtype": "float32", "tie_word_embeddings": True, "transformers_version": "5.0.0"}


def _as_old(config: dict[str, Any]) -> dict[str, Any]:
    """An original / early 4.x config: "p2c|c2p" as one string, no pooler, legacy or special-token fields."""
    dropped = ("pooler_hidden_size", "pooler_dropout", "pooler_hidden_act", "legacy", "bos_token_id", "eos_token_id")
    out = {k: v for k, v in config.items() if k not in dropped and k != "pad_token_id"}
    pos = out.get("pos_att_type")
    if isinstance(pos, list):
        out["pos_att_type"] = "|".join(pos)
    return out | {"transformers_version": "4.6.0"}


@pytest.mark.parametrize("style", ["v3", "v2"])
@pytest.mark.parametrize("rewrite", [_as_5x, _as_old], ids=["5.x", "old"])
def test_config_of_the_other_transformers_version_gives_the_same_numbers(tmp_path: Path, style: str, rewrite) -> None:
    folder = _package(tmp_path / "base", style, 3, seed=9)
    rows = _rows(LENGTHS, seed=10)
    base = _engines(folder)["eager"]
    want_embed, want_logits = base.embed(rows), base.classify_logits(rows)
    config = json.loads((folder / "config.json").read_text())
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps(rewrite(config)))
    (other / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    cfg = DebertaV2Config.from_folder(other)
    assert cfg.pos_att_type in (("p2c", "c2p"), ("c2p", "p2c")) and cfg.pad_token_id == 0
    engine = _engines(other)["eager"]
    assert np.array_equal(engine.embed(rows), want_embed)
    assert np.array_equal(engine.classify_logits(rows), want_logits)
    _, theirs = _alone(_theirs(other, head=True), rows)
    assert _gap(want_logits, theirs) < TOL


@pytest.mark.parametrize("hidden,heads", [(24, 3), (24, 4)])  # head_dim 8 and 6
@pytest.mark.parametrize("style", ["v3", "v2"])
def test_odd_head_sizes(tmp_path: Path, style: str, hidden: int, heads: int) -> None:
    sizes = {"hidden": hidden, "heads": heads, "intermediate": 48}
    folder = _package(tmp_path / style, style, 2, seed=11, sizes=sizes)
    theirs = _theirs(folder, head=True)
    rows = _rows(LENGTHS, seed=12)
    want_mean, want_logits = _alone(theirs, rows)
    encoder, _ = load_deberta_v2(folder)
    assert encoder.blocks[0].head_dim == hidden // heads
    for name, engine in _engines(folder).items():
        assert _gap(engine.embed(rows), want_mean) < TOL, name
        assert _gap(engine.classify_logits(rows), want_logits) < TOL, name
    ids, mask, types = _padded(rows)
    with torch.no_grad():
        want = theirs.deberta(input_ids=ids, attention_mask=mask.long(), token_type_ids=types).last_hidden_state
        assert _gap(encoder(ids, mask, types)[mask], want[mask]) < TOL


@pytest.mark.parametrize("style", ["v3", "conv"])
def test_bfloat16_is_close_to_fp32(tmp_path: Path, style: str) -> None:
    folder = _package(tmp_path / style, style, 3, seed=13)
    rows = _rows(LENGTHS, seed=14)
    fp32 = _engines(folder)["eager"]
    want, want_logits = fp32.embed(rows), fp32.classify_logits(rows)
    encoder, _ = load_deberta_v2(folder, torch.bfloat16)
    assert next(encoder.parameters()).dtype == torch.bfloat16 and encoder.blocks[0].pos_key.dtype == torch.bfloat16
    for name, engine in _engines(folder, torch.bfloat16).items():
        got = engine.embed(rows)
        cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
        assert cos.min() > 0.99, (name, cos)
        logits = engine.classify_logits(rows)
        assert np.isfinite(logits).all() and _gap(logits, want_logits) < 0.1 * np.abs(want_logits).max() + 0.1


@pytest.mark.parametrize("style", ["v3", "conv"])
def test_onnx_export_matches_the_torch_forward(tmp_path: Path, style: str) -> None:
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from vllm_srun.adapters.engines.onnx_export import export_encoder

    folder = _package(tmp_path / style, style, 3, seed=15)
    encoder, head = load_deberta_v2(folder)
    ref = ReferenceEncoder(encoder, head, PoolingConfig(("mean",)))
    session = ort.InferenceSession(str(export_encoder(ref, tmp_path / "m.onnx")))
    names = {i.name for i in session.get_inputs()}
    assert "input_ids" in names and "attention_mask" in names
    for lengths in (LENGTHS, [5, 5], [64, 2]):  # other lengths than the traced 8, past the buckets
        rows = _rows(lengths, seed=len(lengths))
        ids, mask, types = _padded(rows)
        feed = {"input_ids": ids.numpy(), "attention_mask": mask.long().numpy(), "token_type_ids": types.numpy()}
        embeddings, logits = session.run(["embeddings", "logits"], {n: feed[n] for n in names})
        assert _gap(embeddings, ref.embed(rows)) < 1e-4
        assert _gap(logits, ref.classify_logits(rows)) < 1e-4


def test_log_buckets_match_transformers() -> None:
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

    distance = torch.arange(-600, 601)
    for buckets, top in ((256, 512), (16, 32), (16, 128), (8, 24)):
        want = make_log_bucket_position(distance, buckets, top).to(torch.long)
        assert torch.equal(log_bucket(distance, buckets, top), want)


def test_registry_and_reference_load_the_package(tmp_path: Path) -> None:
    folder = _package(tmp_path / "pkg", "v3", 3)
    encoder, head = load_encoder(folder)
    assert isinstance(encoder, DebertaV2Encoder) and isinstance(head, DebertaV2ClassificationHead)
    ref = ReferenceEncoder.from_folder(folder)
    assert ref.has_classifier and ref.config.max_tokens == 128 and ref.dimensions == 32
    with pytest.raises(ValueError, match="exceeds"):
        ref.embed(_rows([129]))


@pytest.mark.parametrize(
    "change,field",
    [
        ({"conv_kernel_size": 4}, "conv_kernel_size"),
        ({"pos_att_type": "p2c|p2p"}, "pos_att_type"),
        ({"norm_rel_ebd": "batch_norm"}, "norm_rel_ebd"),
        ({"hidden_act": "mish"}, "hidden_act"),
        ({"pooler_hidden_act": "mish"}, "pooler_hidden_act"),
        ({"num_attention_heads": 5}, "num_attention_heads"),
        ({"pooler_hidden_size": 16}, "pooler_hidden_size"),
        ({"model_type": "deberta"}, "model_type"),
    ],
)
def test_configs_we_cannot_serve_are_refused_in_one_line(change: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field) as info:
        DebertaV2Config.from_dict(fixture_config(VOCAB, 0, None) | change)
    assert "\n" not in str(info.value)


def test_config_defaults_and_missing_tensor(tmp_path: Path) -> None:
    cfg = DebertaV2Config.from_dict({"model_type": "deberta-v2", "hidden_size": 32, "num_attention_heads": 4})
    assert cfg.relative_span == 512 and cfg.pos_att_type == () and cfg.labels == ["LABEL_0", "LABEL_1"]
    assert cfg.embedding_size == 32 and cfg.attention_head_size == 8 and cfg.type_vocab_size == 0
    v3 = DebertaV2Config.from_dict(fixture_config(VOCAB, 0, None, position_buckets=16))
    assert (v3.relative_max, v3.relative_span, v3.norm_rel_ebd) == (128, 16, ("layer_norm",))
    folder = _package(tmp_path / "pkg", "v2", None)
    from safetensors.numpy import load_file

    tensors = load_file(str(folder / "model.safetensors"))
    del tensors["encoder.layer.1.attention.self.pos_query_proj.bias"]
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(WeightsError, match=r"encoder\.layer\.1\.attention\.self\.pos_query_proj\.bias"):
        load_deberta_v2(folder)


@pytest.mark.parametrize("style", ["v3", "v2", "conv"])
def test_the_one_call_attention_serves_the_position_terms(
    tmp_path: Path, style: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Head sizes the C++ op has (16, 32): on the oneDNN path every layer runs in one call of
    `srun_cpu::deberta_layers` (v3, v2: spied, with the layer loop's bits), or the loop runs the
    op's disentangled attention (conv: the convolution after the first layer keeps the loop), and
    every path matches transformers on rows past the buckets and the clamped span, across the op's
    16-query blocks and 8-key groups, with one row alone as in a crowd."""
    from vllm_srun.adapters.engines.cpu_op_library import VarlenOps

    served: list[int] = []
    plain = VarlenOps.disentangled_attention

    def spy(self, qkv, packed, heads, scale, tables):  # type: ignore[no-untyped-def]
        out = plain(self, qkv, packed, heads, scale, tables)
        if out is not None:
            served.append(heads)
        return out

    monkeypatch.setattr(VarlenOps, "disentangled_attention", spy)
    stacked = spy_stacks(monkeypatch)
    lengths = [180, 150, 150, 33, 17, 16, 9, 3, 1]
    for hidden, heads in ((32, 2), (64, 2)):  # head sizes 16 and 32
        sizes = {"hidden": hidden, "heads": heads, "intermediate": 64, "positions": 200}
        folder = _package(tmp_path / f"{style}-{hidden}", style, 3, seed=15, sizes=sizes)
        encoder, head = load_deberta_v2(folder)
        engines = serving_engines(encoder, head)
        if "unpadded-onednn-cpp" not in engines:
            pytest.skip("no C++ compiler or no oneDNN packed linears here")
        rows = _rows(lengths, seed=16, types=style == "conv")
        want_mean, want_logits = _alone(_theirs(folder, head=True), rows)
        assert want_logits is not None
        served.clear()
        stacked.clear()
        for name, engine in engines.items():
            assert _gap(engine.embed(rows), want_mean) < TOL, name
            assert _gap(engine.classify_logits(rows), want_logits) < TOL * max(1.0, np.abs(want_logits).max()), name
        cpp = engines["unpadded-onednn-cpp"]
        crowd = cpp.embed(rows)
        if style == "conv":
            assert served and not any(stacked)  # the loop, on the op's attention
        else:
            assert stacked == [True] * 3 and not served  # one call a forward; no layer ran in Python
            assert cpp.packed is not None
            loop = NativeEncoder(cpp.reference, cpp.packed, KernelPlan(FORCED_UP_TO), ops=LayerLoop())
            assert np.array_equal(loop.embed(rows), crowd)
            assert served  # the loop's attention is the same op
    assert np.array_equal(cpp.embed(rows[3:4]), crowd[3:4])  # a row's bits are its own
