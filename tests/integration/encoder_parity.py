"""Shared checks of the encoder-architecture parity tests (`test_distilbert_parity.py`,
`test_mpnet_parity.py`, `test_roberta_parity.py`): tiny packages written from a config and
numpy weights, transformers' model for them, and our padded, unpadded (eager and oneDNN packed),
BF16 and ONNX paths measured against it as a max abs diff."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from vllm_srun.adapters.engines.cpu_onednn import PackedEncoder, onednn_unsupported
from vllm_srun.adapters.engines.cpu_op_library import VarlenOps, cpu_ops
from vllm_srun.adapters.engines.native import FORCED_UP_TO, NativeEncoder
from vllm_srun.adapters.models.pooling import PoolingConfig
from vllm_srun.adapters.models.reference_encoder import ReferenceEncoder
from vllm_srun.adapters.models.tokenization import Encoded
from vllm_srun.domain.worker.kernels import KernelPlan, bucket_rows

transformers = pytest.importorskip("transformers")

TOL = 1e-5  # FP32 parity, max abs diff
ONNX_TOL = 1e-4
VOCAB = 60
# a mixed batch: two rows of equal length, a one-token row, rows shorter and longer than the rest
LENGTHS = (9, 4, 16, 9, 1, 23, 6)
MEAN = PoolingConfig(("mean",))
Loader = Callable[..., tuple[Any, Any]]


def write_package(folder: Path, config: dict[str, Any], weights: dict[str, np.ndarray]) -> Path:
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def write_fixture(
    module: Any,
    pad: int,
    folder: Path,
    num_labels: int | None,
    seed: int = 0,
    edit: Callable[[dict[str, Any]], None] | None = None,
    **options: Any,
) -> Path:
    """A tiny package from an architecture MODULE's `fixture_config` (VOCAB ids, pad id PAD, OPTIONS)
    and `fixture_weights` (SEED); EDIT rewrites the config first (the weights follow the edited one)."""
    config = module.fixture_config(VOCAB, pad, num_labels, **options)
    if edit is not None:
        edit(config)
    return write_package(folder, config, module.fixture_weights(config, num_labels, seed))


def hf_model(folder: Path, classify: bool) -> Any:
    """transformers' model for FOLDER (eval, FP32, eager attention), checked to load every tensor."""
    auto = transformers.AutoModelForSequenceClassification if classify else transformers.AutoModel
    model, info = auto.from_pretrained(
        folder, attn_implementation="eager", dtype=torch.float32, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    return model.eval()


def make_rows(lengths: Sequence[int], seed: int, *, first: int, last: int, low: int = 3) -> list[Encoded]:
    """Rows as a tokenizer writes them: FIRST, random ids in [LOW, VOCAB), LAST (a 1-token row: FIRST only)."""
    rng = np.random.default_rng(seed)
    rows = []
    for n in lengths:
        ids = [first] if n == 1 else [first, *rng.integers(low, VOCAB, n - 2).tolist(), last]
        rows.append(Encoded(ids, [0] * n, False, n))
    return rows


def padded(rows: Sequence[Encoded], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids right-padded with PAD, and the 0/1 attention mask."""
    t = max(len(r.ids) for r in rows)
    ids = torch.tensor([[*r.ids, *[pad] * (t - len(r.ids))] for r in rows])
    mask = torch.tensor([[1] * len(r.ids) + [0] * (t - len(r.ids)) for r in rows])
    return ids, mask


def max_diff(got: Any, want: Any) -> float:
    got, want = (np.asarray(torch.as_tensor(x).detach().float().numpy()) for x in (got, want))
    assert got.shape == want.shape, (got.shape, want.shape)
    return float(np.abs(got - want).max())


def hf_row_means(hf: Any, rows: Sequence[Encoded]) -> np.ndarray:
    """Each row run alone through transformers, its last hidden state mean-pooled."""
    base = hf.base_model
    with torch.no_grad():
        return np.stack(
            [base(input_ids=torch.tensor([list(r.ids)])).last_hidden_state[0].mean(0).numpy() for r in rows]
        )


def hf_logits(hf: Any, rows: Sequence[Encoded], pad: int) -> np.ndarray:
    ids, mask = padded(rows, pad)
    with torch.no_grad():
        return hf(input_ids=ids, attention_mask=mask).logits.numpy()


def serving_engines(encoder: Any, head: Any) -> dict[str, NativeEncoder]:
    """The unpadded forward on eager linears, and on the oneDNN packed copies where this CPU has them."""
    reference = ReferenceEncoder(encoder, head, MEAN)
    engines = {"unpadded-eager": NativeEncoder(reference)}
    if onednn_unsupported("cpu", next(encoder.parameters()).dtype) is None:
        packed = NativeEncoder(reference, PackedEncoder(encoder, head), KernelPlan(FORCED_UP_TO))
        assert packed.packed is not None and packed.determinism == "batch_invariant"  # every forward on the copies
        engines["unpadded-onednn"] = packed
        ops, _ = cpu_ops(torch.float32, lambda _line: None)
        if isinstance(ops, VarlenOps):  # the C++ ops built here: the one-call forward where it runs this model
            engines["unpadded-onednn-cpp"] = NativeEncoder(reference, packed.packed, KernelPlan(FORCED_UP_TO), ops=ops)
    return engines


def check_padded_hidden(encoder: Any, hf: Any, rows: Sequence[Encoded], pad: int) -> float:
    ids, mask = padded(rows, pad)
    with torch.no_grad():
        want = hf.base_model(input_ids=ids, attention_mask=mask).last_hidden_state
        got = encoder(ids, mask.bool())
    valid = mask.bool()
    gap = max_diff(got[valid], want[valid])
    print(f"padded hidden state: {gap:.1e}")  # the figures, with pytest -s
    assert gap <= TOL, f"padded hidden state differs by {gap:.2e}"
    assert float(want[valid].std()) > 0.1  # not a degenerate output
    return gap


def check_embeddings(encoder: Any, head: Any, hf: Any, rows: Sequence[Encoded]) -> dict[str, float]:
    """Every serving path's mean-pooled rows of one mixed batch against each row alone in transformers."""
    want = hf_row_means(hf, rows)
    gaps = {"padded-reference": max_diff(ReferenceEncoder(encoder, head, MEAN).embed(rows), want)}
    for name, engine in serving_engines(encoder, head).items():
        gaps[name] = max_diff(engine.embed(rows), want)
    print("embeddings:", {k: f"{v:.1e}" for k, v in gaps.items()})
    assert all(g <= TOL for g in gaps.values()), gaps
    sims = np.corrcoef(want)
    assert sims[~np.eye(len(want), dtype=bool)].max() < 0.999  # the rows really differ
    return gaps


def check_logits(encoder: Any, head: Any, hf: Any, rows: Sequence[Encoded], pad: int) -> dict[str, float]:
    assert head is not None
    want = hf_logits(hf, rows, pad)
    assert want.shape == (len(rows), hf.config.num_labels) and want.std() > 1e-2
    gaps = {"padded-reference": max_diff(ReferenceEncoder(encoder, head, MEAN).classify_logits(rows), want)}
    for name, engine in serving_engines(encoder, head).items():
        gaps[name] = max_diff(engine.classify_logits(rows), want)
    print("logits:", {k: f"{v:.1e}" for k, v in gaps.items()})
    # relative to the logits' size past 1 (as the load's numerics gate measures): logits of about 9
    # differ from transformers' own FP64 answer by 7e-6 in FP32, and our paths by as much (Zen 5)
    tol = TOL * max(1.0, float(np.abs(want).max()))
    assert all(g <= tol for g in gaps.values()), (gaps, tol)
    return gaps


def check_every_path(encoder: Any, head: Any, hf: Any, rows: Sequence[Encoded], pad: int) -> None:
    """The padded hidden state, then every path's embeddings and logits, against transformers' HF."""
    check_padded_hidden(encoder, hf, rows, pad)
    check_embeddings(encoder, head, hf, rows)
    check_logits(encoder, head, hf, rows, pad)


def check_one_call_forward(encoder: Any, head: Any, hf: Any, rows: Sequence[Encoded], pad: int) -> None:
    """Where this machine builds the C++ ops: they run ENCODER's whole forward in one call
    (`srun_cpu::encode`, asserted), and every path's answers match transformers'."""
    engines = serving_engines(encoder, head)
    if "unpadded-onednn-cpp" not in engines:
        pytest.skip("no C++ compiler or no oneDNN packed linears here")
    cpp = engines["unpadded-onednn-cpp"]
    total = bucket_rows(sum(len(r.ids) for r in rows))
    assert cpp.ops.encode(encoder, cpp.packed_linears, rows, total, "mean", False) is not None  # it runs here
    check_every_path(encoder, head, hf, rows, pad)


def check_loads_the_same(loader: Loader, base: Path, other: Path, rows: Sequence[Encoded], pad: int) -> tuple[Any, Any]:
    """OTHER (BASE's package with config.json written another way) gives BASE's logits to the bit and
    transformers' within TOL; returns OTHER's encoder and head."""
    want = NativeEncoder(ReferenceEncoder(*loader(base), MEAN))
    encoder, head = loader(other)
    got = NativeEncoder(ReferenceEncoder(encoder, head, MEAN))
    assert np.array_equal(got.classify_logits(rows), want.classify_logits(rows))
    check_logits(encoder, head, hf_model(other, classify=True), rows, pad)
    return encoder, head


def check_bf16(loader: Loader, folder: Path, rows: Sequence[Encoded], classify: bool) -> float:
    """`--dtype bfloat16`: the serving forward's answers point where FP32's do (cosine > 0.99)."""
    fp32 = NativeEncoder(ReferenceEncoder(*loader(folder, torch.float32), MEAN))
    encoder, head = loader(folder, torch.bfloat16)
    assert next(encoder.parameters()).dtype == torch.bfloat16
    worst = 1.0
    for engine in (ReferenceEncoder(encoder, head, MEAN), *serving_engines(encoder, head).values()):
        pairs = [(engine.embed(rows), fp32.embed(rows))]
        if classify:
            pairs.append((engine.classify_logits(rows).T, fp32.classify_logits(rows).T))
        for got, want in pairs:
            cos = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
            worst = min(worst, float(cos.min()))
    print(f"bf16 worst cosine vs fp32: {worst:.5f}")
    assert worst > 0.99, worst
    return worst


def check_onnx(encoder: Any, head: Any, rows: Sequence[Encoded], pad: int, path: Path) -> dict[str, float]:
    """The ONNX export (pooled embeddings, logits) under ONNX Runtime against our padded forward."""
    ort = pytest.importorskip("onnxruntime")
    from vllm_srun.adapters.engines.onnx_export import export_encoder

    reference = ReferenceEncoder(encoder, head, MEAN)
    export_encoder(reference, path)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ids, mask = padded(rows, pad)
    feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "token_type_ids": np.zeros_like(ids.numpy())}
    outputs = session.run(None, {i.name: feeds[i.name] for i in session.get_inputs()})
    gaps = {"onnx-embeddings": max_diff(outputs[0], reference.embed(rows))}
    if head is not None:
        gaps["onnx-logits"] = max_diff(outputs[1], reference.classify_logits(rows))
    print("onnx:", {k: f"{v:.1e}" for k, v in gaps.items()})
    assert all(g <= ONNX_TOL for g in gaps.values()), gaps
    return gaps


class LayerLoop(VarlenOps):
    """The C++ ops with every layer stack declined: the Python layer loop, on the same one-call
    attention (what a stack's rows must equal bit for bit)."""

    def stack(self, encoder, linears, x, packed, inputs):  # type: ignore[no-untyped-def]
        return None


def spy_stacks(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each `VarlenOps.stack` call from now on ran its stack (True) or declined (False)."""
    calls: list[bool] = []
    plain = VarlenOps.stack

    def spy(self, encoder, linears, x, packed, inputs):  # type: ignore[no-untyped-def]
        out = plain(self, encoder, linears, x, packed, inputs)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(VarlenOps, "stack", spy)
    return calls
