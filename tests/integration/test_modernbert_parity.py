"""Our torch ModernBERT (`models/modernbert.py`) against transformers' (test-only reference).

Tiny random packages written by our fixture helpers (3 layers, global every 2nd layer, a local
window of 8 so rows of 9+ tokens meet the sliding window): the padded forward, the unpadded serving
forward (eager and oneDNN packed linears), both classifier poolings, 4.x- and 5.x-style configs,
small/odd head sizes, BF16 and the ONNX export, each against transformers within 1e-5 (FP32).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import save_file

from tests.integration.encoder_parity import LayerLoop, spy_stacks
from vllm_srun.adapters.engines.cpu_onednn import PackedEncoder, onednn_unsupported
from vllm_srun.adapters.engines.native import FORCED_UP_TO, NativeEncoder
from vllm_srun.adapters.families.fixtures import modernbert_fixture
from vllm_srun.adapters.models import modernbert as mb
from vllm_srun.adapters.models.encoder_arch import eager_linears, hidden_states
from vllm_srun.adapters.models.encoders import load_encoder
from vllm_srun.adapters.models.pooling import PoolingConfig
from vllm_srun.adapters.models.reference_encoder import ReferenceEncoder
from vllm_srun.adapters.models.tokenization import Encoded
from vllm_srun.adapters.models.unpadded import PackedRows
from vllm_srun.adapters.models.weights import WeightsError
from vllm_srun.domain.worker.kernels import KernelPlan

TOL = 1e-5
VOCAB, PAD = 100, 0
WINDOW = 8  # local_attention: keys within ±4
LENGTHS = [21, 3, 11, 11, 1, 7, 16, 5]  # longer and shorter than the window, two of equal length
SHORT = [5, 3, 3, 1]  # no row longer than the window: the local layers' unmasked path
MEAN = PoolingConfig(("mean",))
ONEDNN = onednn_unsupported("cpu", torch.float32)


def _config(num_labels: int | None = None, **kw: Any) -> dict[str, Any]:
    args: dict[str, Any] = {"layers": 3, "local_attention": WINDOW, "global_every": 2} | kw
    return modernbert_fixture.fixture_config(VOCAB, PAD, num_labels, **args)


def _package(folder: Path, config: dict[str, Any], num_labels: int | None = None, seed: int = 0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    save_file(
        modernbert_fixture.fixture_weights(config, num_labels, seed),
        str(folder / "model.safetensors"),
        metadata={"format": "pt"},
    )
    return folder


def _theirs(folder: Path, classifier: bool = False) -> torch.nn.Module:
    auto = transformers.AutoModelForSequenceClassification if classifier else transformers.AutoModel
    return auto.from_pretrained(folder, attn_implementation="eager").float().eval()


def _rows(lengths: list[int], seed: int = 3) -> list[Encoded]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for n in lengths:
        ids = torch.randint(1, VOCAB, (n,), generator=gen).tolist()
        out.append(Encoded(ids, [0] * n, False, n))
    return out


def _padded(rows: list[Encoded]) -> tuple[torch.Tensor, torch.Tensor]:
    t = max(len(r.ids) for r in rows)
    ids = torch.tensor([[*r.ids, *([PAD] * (t - len(r.ids)))] for r in rows])
    mask = torch.arange(t)[None, :] < torch.tensor([len(r.ids) for r in rows])[:, None]
    return ids, mask


def _alone_hidden(model: torch.nn.Module, rows: list[Encoded]) -> list[torch.Tensor]:
    with torch.no_grad():
        return [model(input_ids=torch.tensor([list(r.ids)])).last_hidden_state[0] for r in rows]


def _alone_mean(model: torch.nn.Module, rows: list[Encoded]) -> np.ndarray:
    return torch.stack([h.mean(dim=0) for h in _alone_hidden(model, rows)]).numpy()


def _alone_logits(model: torch.nn.Module, rows: list[Encoded]) -> np.ndarray:
    with torch.no_grad():
        return torch.cat([model(input_ids=torch.tensor([list(r.ids)])).logits for r in rows]).numpy()


def _engine(reference: ReferenceEncoder, path: str) -> NativeEncoder:
    if path == "eager":
        return NativeEncoder(reference)
    if ONEDNN is not None:
        pytest.skip(f"oneDNN packed path unavailable: {ONEDNN}")
    return NativeEncoder(reference, PackedEncoder(reference.encoder, reference.head), KernelPlan(FORCED_UP_TO))


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    folder = _package(tmp_path_factory.mktemp("modernbert") / "bare", _config())
    return folder, _theirs(folder)


def test_fixture_loads_in_transformers_without_missing_keys(tmp_path: Path) -> None:
    for labels, auto in ((None, transformers.AutoModel), (3, transformers.AutoModelForSequenceClassification)):
        folder = _package(tmp_path / str(labels), _config(labels), labels)
        _, info = auto.from_pretrained(folder, output_loading_info=True)
        assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    encoder, head = load_encoder(tmp_path / "3")
    assert isinstance(encoder, mb.ModernBertEncoder) and isinstance(head, mb.ModernBertHead)
    assert encoder.config.labels == ["LABEL_0", "LABEL_1", "LABEL_2"] and encoder.config.max_tokens == 128
    assert [b.window for b in encoder.blocks] == [None, WINDOW // 2, None]
    assert all(b.glu and b.ffn_in.out_features == 128 for b in encoder.blocks)
    assert load_encoder(tmp_path / "None")[1] is None


def test_padded_hidden_state_matches(bare) -> None:
    folder, theirs = bare
    encoder, _ = mb.load_modernbert(folder)
    ids, mask = _padded(_rows(LENGTHS))
    with torch.no_grad():
        want = theirs(input_ids=ids, attention_mask=mask.long()).last_hidden_state
        got = encoder(ids, mask)
        full = encoder(ids[:1, :21], None)  # the longest row needs no mask
    gap = float((got - want)[mask].abs().max())
    assert gap < TOL, gap
    assert float((full[0] - want[0]).abs().max()) < TOL
    # the window matters: the same rows with a wide window give other numbers
    wide = mb.ModernBertConfig.from_dict(_config() | {"local_attention": 128})
    encoder.blocks[1].window = wide.local_attention // 2
    with torch.no_grad():
        assert float((encoder(ids, mask) - want)[mask].abs().max()) > 1e-3


@pytest.mark.parametrize("path", ["eager", "onednn"])
@pytest.mark.parametrize("lengths", [LENGTHS, SHORT], ids=["window", "short"])
def test_unpadded_embeddings_match_rows_alone(bare, path: str, lengths: list[int]) -> None:
    folder, theirs = bare
    encoder, _ = mb.load_modernbert(folder)
    reference = ReferenceEncoder(encoder, None, MEAN)
    engine = _engine(reference, path)
    rows = _rows(lengths)
    want = _alone_mean(theirs, rows)
    got = engine.embed(rows)
    assert got.shape == (len(rows), 32) and got.dtype == np.float32
    assert np.abs(got - want).max() < TOL, np.abs(got - want).max()
    assert np.abs(reference.embed(rows) - want).max() < TOL  # the padded reference path too
    # every token of every row, not only the means
    packed = PackedRows.build(rows)
    linears = eager_linears(encoder) if path == "eager" else engine.packed_linears
    with torch.inference_mode():
        hidden = hidden_states(encoder, packed, linears)
    alone = _alone_hidden(theirs, rows)
    for pos, i in enumerate(packed.order):
        start = int(packed.starts[pos])
        assert float((hidden[start : start + lengths[i]] - alone[i]).abs().max()) < TOL


@pytest.mark.parametrize("path", ["eager", "onednn"])
@pytest.mark.parametrize("pooling", ["cls", "mean"])
@pytest.mark.parametrize("num_labels", [3, 1])
def test_logits_match(tmp_path: Path, path: str, pooling: str, num_labels: int) -> None:
    folder = _package(tmp_path, _config(num_labels, classifier_pooling=pooling), num_labels)
    theirs = _theirs(folder, classifier=True)
    encoder, head = mb.load_modernbert(folder)
    assert head is not None and head.reads_first_token == (pooling == "cls")
    reference = ReferenceEncoder(encoder, head, MEAN)
    rows = _rows(LENGTHS)
    want = _alone_logits(theirs, rows)
    assert want.std() > 1e-2
    got = _engine(reference, path).classify_logits(rows)
    assert got.shape == (len(rows), num_labels)
    assert np.abs(got - want).max() < TOL, np.abs(got - want).max()
    assert np.abs(reference.classify_logits(rows) - want).max() < TOL  # padded, masked
    ids, mask = _padded(rows)
    with torch.no_grad():
        batched = theirs(input_ids=ids, attention_mask=mask.long()).logits.numpy()
    assert np.abs(batched - want).max() < TOL


def _v4(config: dict[str, Any], global_theta: float, local_theta: float | None) -> dict[str, Any]:
    """The same model as transformers 4.x writes it: no layer_types / rope_parameters, thetas flat."""
    old = {k: v for k, v in config.items() if k not in ("layer_types", "rope_parameters", "dtype")}
    return old | {
        "global_rope_theta": global_theta,
        "local_rope_theta": local_theta,
        "reference_compile": None,
        "repad_logits_with_grad": False,
        "torch_dtype": "float32",
        "transformers_version": "4.48.0",
    }


def test_both_transformers_config_styles_load_alike(tmp_path: Path) -> None:
    new = _config(3) | {"rope_parameters": {mb.GLOBAL: {"rope_theta": 20000.0}, mb.LOCAL: {"rope_theta": 500.0}}}
    folders = {
        "v5": _package(tmp_path / "v5", new, 3),
        "v4": _package(tmp_path / "v4", _v4(new, 20000.0, 500.0), 3),
    }
    rows = _rows(LENGTHS)
    answers = {}
    for style, folder in folders.items():
        theirs = _theirs(folder, classifier=True)
        encoder, head = mb.load_modernbert(folder)
        cfg = encoder.config
        assert (cfg.global_rope_theta, cfg.local_rope_theta) == (20000.0, 500.0), style
        assert cfg.layer_types == (mb.GLOBAL, mb.LOCAL, mb.GLOBAL)
        reference = ReferenceEncoder(encoder, head, MEAN)
        got = NativeEncoder(reference).classify_logits(rows)
        assert np.abs(got - _alone_logits(theirs, rows)).max() < TOL, style
        answers[style] = got
    assert np.array_equal(answers["v4"], answers["v5"])
    # the default thetas give other numbers: the fields are really read
    default = _package(tmp_path / "default", _config(3), 3)
    assert (
        np.abs(NativeEncoder(ReferenceEncoder(*load_encoder(default), MEAN)).classify_logits(rows) - got).max() > 1e-3
    )
    # 4.x: a null local theta means the global one; 5.x: layer_types wins over the every-n field
    assert mb.ModernBertConfig.from_dict(_v4(new, 7.0, None)).local_rope_theta == 7.0
    odd = mb.ModernBertConfig.from_dict(_config() | {"layer_types": [mb.LOCAL, mb.GLOBAL, mb.LOCAL]})
    assert odd.layer_types == (mb.LOCAL, mb.GLOBAL, mb.LOCAL)
    defaults = {k: v for k, v in _v4(new, 1.0, 1.0).items() if not k.endswith("rope_theta")}
    defaults.pop("global_attn_every_n_layers")
    cfg = mb.ModernBertConfig.from_dict(defaults)
    assert (cfg.global_rope_theta, cfg.local_rope_theta) == (160000.0, 10000.0)
    assert cfg.layer_types == (mb.GLOBAL, mb.LOCAL, mb.LOCAL)  # every 3rd by default


def test_custom_layer_types_match(tmp_path: Path) -> None:
    config = _config() | {"layer_types": [mb.LOCAL, mb.GLOBAL, mb.LOCAL]}
    config.pop("global_attn_every_n_layers")
    folder = _package(tmp_path, config)
    theirs = _theirs(folder)
    rows = _rows(LENGTHS)
    got = NativeEncoder(ReferenceEncoder(*mb.load_modernbert(folder), MEAN)).embed(rows)
    assert np.abs(got - _alone_mean(theirs, rows)).max() < TOL


@pytest.mark.parametrize("path", ["eager", "onednn"])
@pytest.mark.parametrize("hidden,heads", [(24, 3), (24, 4)], ids=["head_dim8", "head_dim6"])
def test_small_head_sizes(tmp_path: Path, path: str, hidden: int, heads: int) -> None:
    folder = _package(tmp_path, _config(2, hidden=hidden, heads=heads, intermediate=40), 2)
    theirs = _theirs(folder, classifier=True)
    encoder, head = mb.load_modernbert(folder)
    assert encoder.blocks[0].head_dim == hidden // heads
    reference = ReferenceEncoder(encoder, head, MEAN)
    engine = _engine(reference, path)
    rows = _rows(LENGTHS)
    assert np.abs(engine.classify_logits(rows) - _alone_logits(theirs, rows)).max() < TOL
    ids, mask = _padded(rows)
    with torch.no_grad():
        want = theirs.model(input_ids=ids, attention_mask=mask.long()).last_hidden_state
        assert float((encoder(ids, mask) - want)[mask].abs().max()) < TOL
    means = torch.stack([want[i, : len(r.ids)].mean(0) for i, r in enumerate(rows)]).numpy()
    assert np.abs(engine.embed(rows) - means).max() < TOL


@pytest.mark.parametrize("act", ["gelu", "silu"])
@pytest.mark.parametrize("biases", [False, True])
def test_every_layer_runs_in_one_call_with_the_sliding_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, act: str, biases: bool
) -> None:
    """Head size 16 (the C++ op has it): every layer and the final norm run in one call of
    `srun_cpu::modernbert_layers` (spied), whose rows carry the Python layer loop's bits, with rows
    longer than the window (the sliding layers' window as a bias of the distance; the loop, spied,
    gives it to its sliding layers only) and rows within it, and match transformers. BIASES: the
    norms' and the linears' biases (ModernBERT's own have none)."""
    from vllm_srun.adapters.engines import cpp_ops
    from vllm_srun.adapters.engines.cpu_op_library import VarlenOps, load_varlen_attention

    if ONEDNN is not None or cpp_ops.compiler(os.environ) is None or load_varlen_attention(lambda _m: None):
        pytest.skip("no oneDNN packed path or no C++ op here")
    windowed: list[int] = []
    plain_attention = VarlenOps.attention

    def spy_attention(self, qkv, packed, heads, relative=None):  # type: ignore[no-untyped-def]
        if relative is not None:
            windowed.append(packed.longest)
        return plain_attention(self, qkv, packed, heads, relative)

    monkeypatch.setattr(VarlenOps, "attention", spy_attention)
    stacks = spy_stacks(monkeypatch)
    config = _config(2, hidden=32, heads=2, intermediate=40) | {"hidden_activation": act}
    config |= {"norm_bias": biases, "attention_bias": biases, "mlp_bias": biases}
    folder = _package(tmp_path, config, 2)
    theirs = _theirs(folder, classifier=True)
    encoder, head = mb.load_modernbert(folder)
    reference = ReferenceEncoder(encoder, head, MEAN)
    packed = PackedEncoder(encoder, head)
    engine = NativeEncoder(reference, packed, KernelPlan(FORCED_UP_TO), ops=VarlenOps())
    loop = NativeEncoder(reference, packed, KernelPlan(FORCED_UP_TO), ops=LayerLoop())
    for lengths in ([40, 21, 17, 11, 11, 5, 1], SHORT):
        rows = _rows(lengths)
        stacks.clear()
        assert np.abs(engine.classify_logits(rows) - _alone_logits(theirs, rows)).max() < TOL
        got = engine.embed(rows)
        assert stacks == [True, True] and not windowed  # one call a forward; no layer ran in Python
        assert np.abs(got - _alone_mean(theirs.model, rows)).max() < TOL
        assert np.array_equal(got, loop.embed(rows))
        assert np.array_equal(np.concatenate([engine.embed([r]) for r in rows]), got)  # a row's own bits
        if max(lengths) > WINDOW // 2 + 1:
            assert set(windowed) == {max(lengths)}  # the loop: only the sliding layers, every row in the call
            windowed.clear()
        assert not windowed


@pytest.mark.parametrize("path", ["eager", "onednn"])
def test_bfloat16_is_close_to_fp32(bare, path: str) -> None:
    folder, theirs = bare
    if path == "onednn" and (why := onednn_unsupported("cpu", torch.bfloat16)) is not None:
        pytest.skip(f"oneDNN BF16 path unavailable: {why}")
    encoder, _ = mb.load_modernbert(folder, torch.bfloat16)
    assert next(encoder.parameters()).dtype == torch.bfloat16
    reference = ReferenceEncoder(encoder, None, MEAN)
    engine = (
        NativeEncoder(reference)
        if path == "eager"
        else NativeEncoder(reference, PackedEncoder(encoder, None), KernelPlan(FORCED_UP_TO))
    )
    rows = _rows(LENGTHS)
    want = _alone_mean(theirs, rows)
    for got in (engine.embed(rows), reference.embed(rows)):
        cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
        assert cos.min() > 0.99, cos


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_onnx_export_matches(tmp_path: Path, pooling: str) -> None:
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from vllm_srun.adapters.engines.onnx_export import export_encoder

    folder = _package(tmp_path / "pkg", _config(3, classifier_pooling=pooling), 3)
    theirs = _theirs(folder, classifier=True)
    encoder, head = mb.load_modernbert(folder)
    path = export_encoder(ReferenceEncoder(encoder, head, MEAN), tmp_path / "m.onnx")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    for lengths in (LENGTHS, [30, 2], [4]):  # longer than the traced 8 tokens, and other batch sizes
        rows = _rows(lengths)
        ids, mask = _padded(rows)
        feed = {"input_ids": ids.numpy(), "attention_mask": mask.long().numpy(), "token_type_ids": 0 * ids.numpy()}
        embeddings, logits = session.run(["embeddings", "logits"], {k: v for k, v in feed.items() if k in names})
        with torch.no_grad():
            hidden = theirs.model(input_ids=ids, attention_mask=mask.long()).last_hidden_state
        means = torch.stack([hidden[i, : len(r.ids)].mean(0) for i, r in enumerate(rows)]).numpy()
        assert np.abs(embeddings - means).max() < 1e-4, lengths
        assert np.abs(logits - _alone_logits(theirs, rows)).max() < 1e-4, lengths


@pytest.mark.parametrize(
    "change,field",
    [
        ({"model_type": "bert"}, "model_type"),
        ({"hidden_activation": "mish"}, "hidden_activation"),
        ({"classifier_activation": "mish"}, "classifier_activation"),
        ({"classifier_pooling": "max"}, "classifier_pooling"),
        ({"num_attention_heads": 5}, "hidden_size"),
        ({"hidden_size": 36, "num_attention_heads": 4}, "num_attention_heads"),
        ({"rope_parameters": {mb.GLOBAL: {"rope_type": "yarn", "rope_theta": 1.0}}}, "rope_parameters"),
        ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling"),
        ({"layer_types": [mb.GLOBAL]}, "layer_types"),
        ({"layer_types": None, "global_attn_every_n_layers": 0}, "global_attn_every_n_layers"),
    ],
)
def test_unservable_configs_say_which_field(change: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field) as info:
        mb.ModernBertConfig.from_dict(_config() | change)
    assert "\n" not in str(info.value)


def test_missing_tensor_is_named(tmp_path: Path) -> None:
    config = _config()
    folder = tmp_path / "pkg"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    weights = modernbert_fixture.fixture_weights(config, None, 0)
    del weights["layers.2.mlp.Wi.weight"]
    save_file(weights, str(folder / "model.safetensors"))
    with pytest.raises(WeightsError, match=r"layers\.2\.mlp\.Wi\.weight"):
        mb.load_modernbert(folder)
