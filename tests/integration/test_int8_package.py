"""Int8 packages (`vllm-srun quantize --int8`) served: quantize tiny fixtures of every encoder
architecture and MiniLM, serve them on int8 GEMMs, and compare with the package's own reference
(the dequantized weights in FP32) and with the FP32 original; the card, the probe, the golden file
recorded at int8; the refusals at load (a CPU without VNNI, a GPU, ONNX Runtime, bfloat16)."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.integration.serving import serving
from tests.stores import session_store
from vllm_srun.adapters.contracts import EngineRefused, EngineRequest
from vllm_srun.adapters.devices.torch_devices import CpuDevice
from vllm_srun.adapters.engines.cpu_int8 import Int8Encoder, int8_encoder, int8_unsupported
from vllm_srun.adapters.engines.int8_kernels import load_int8_kernels
from vllm_srun.adapters.engines.native import native_encoder
from vllm_srun.adapters.engines.plugins import OnnxRuntimePlugin
from vllm_srun.adapters.models.quantize import GOLDEN_TOLERANCE, read_quantization
from vllm_srun.adapters.models.quantize_package import write_int8_package
from vllm_srun.adapters.models.reference_encoder import ReferenceEncoder
from vllm_srun.adapters.models.tokenization import TextTokenizer
from vllm_srun.adapters.readiness.probe import batch_invariant
from vllm_srun.app.quantize import quantize
from vllm_srun.domain.settings.engine_args import EngineArgs

pytestmark = pytest.mark.skipif(
    int8_unsupported("cpu", torch.float32) is not None,
    reason=f"int8 packages do not run here: {int8_unsupported('cpu', torch.float32)}",
)
TEXTS = ["the cat sat on the mat", "a", "a quick brown fox jumps over the lazy dog " * 3, "red blue green"]
QUIET = lambda _msg: None  # noqa: E731


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.fixture(scope="module")
def tiny_int8(encoder_fixture, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:  # type: ignore[no-untyped-def]
    """(FP32 fixture, its int8 package) written by `vllm-srun quantize`'s code path, golden included."""
    source = encoder_fixture("embed")
    out = tmp_path_factory.mktemp("int8") / "tiny-embed-int8"
    return source, quantize(str(source), out, progress=QUIET, store=session_store())


def test_served_int8_answers_match_the_package_reference_and_stay_close_to_fp32(tiny_int8) -> None:  # type: ignore[no-untyped-def]
    source, out = tiny_int8
    assert read_quantization(out) is not None and not (out / "model.onnx").exists()
    rows = TextTokenizer.from_folder(out).encode(TEXTS)
    dequantized = ReferenceEncoder.from_folder(out).embed(rows)  # the package's own answers, FP32 throughout
    original = ReferenceEncoder.from_folder(source).embed(rows)
    with serving([out]) as (client, _):
        card = client.get("/v1/models").json()["data"][0]
        r = client.post("/v1/embeddings", json={"input": TEXTS})
    assert r.status_code == 200
    got = np.array([d["embedding"] for d in r.json()["data"]])
    # int8 activations: within a few percent of the dequantized reference, and near it in direction
    assert np.abs(got - dequantized).max() <= 0.03 * np.abs(dequantized).max()
    assert _cosines(got, dequantized).min() >= 0.999
    assert _cosines(got, original).min() >= 0.995
    assert card["quantization"]["method"] == "vllm-srun-int8" and card["quantization"]["bits"] == 8
    assert card["quantization"]["activations"].startswith("dynamic per-token")
    assert card["kernels"]["linear"].startswith("int8")
    assert card["golden"]["status"] == "matched"  # the golden file was recorded at int8, by the same path
    assert card["golden"]["tolerance"] == GOLDEN_TOLERANCE
    assert card["numerics"] == "exact"  # the probe: a row's answer does not depend on its company


@pytest.mark.parametrize(
    "variant",
    [
        "classify",
        "rerank",
        "roberta-embed",
        "xlm-roberta-classify",
        "distilbert-embed",
        "mpnet-embed",
        "deberta-v2-embed",
        "modernbert-classify",
        "qwen3-embed",
        "qwen2-rerank",
        "llama-embed",
    ],
)
def test_every_architecture_quantizes_and_serves_int8(encoder_fixture, tmp_path: Path, variant: str) -> None:  # type: ignore[no-untyped-def]
    source = encoder_fixture(variant)
    written = write_int8_package(source, tmp_path / "int8", QUIET)
    assert written.tensors >= written.linears > 0 and written.bytes_after < written.bytes_before
    reference = ReferenceEncoder.from_folder(written.out)
    engine = native_encoder(reference, CpuDevice(), QUIET)
    assert isinstance(engine, Int8Encoder)
    tokenizer = TextTokenizer.from_folder(source)
    if reference.head is not None and variant.endswith("rerank"):
        rows = tokenizer.encode_pairs([("who sat?", t) for t in TEXTS])
    else:
        rows = tokenizer.encode(TEXTS)
    if reference.head is not None:
        got, want = engine.classify_logits(rows), reference.classify_logits(rows)
    else:
        got, want = engine.embed(rows), reference.embed(rows)
    assert np.abs(got - want).max() <= 0.05 * max(1.0, float(np.abs(want).max()))


@pytest.fixture(scope="module")
def minilm_int8(minilm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_int8_package(minilm_dir, tmp_path_factory.mktemp("minilm") / "minilm-int8", QUIET).out


def _short_texts(n: int) -> list[str]:
    """One to twenty words, like the bench's short texts (one-word texts are int8's hardest)."""
    words = [
        "the",
        "of",
        "and",
        "to",
        "in",
        "is",
        "billing",
        "refund",
        "invoice",
        "password",
        "reset",
        "shipping",
        "order",
        "late",
        "agent",
        "human",
    ]
    rng = random.Random(1)
    return [" ".join(rng.choice(words) for _ in range(rng.randint(1, 20))) for _ in range(n)]


def test_minilm_int8_stays_within_cosine_099_of_fp32_and_is_batch_invariant(
    minilm_dir: Path, minilm_int8: Path
) -> None:
    reference = ReferenceEncoder.from_folder(minilm_int8)
    engine = native_encoder(reference, CpuDevice(), QUIET)
    rows = TextTokenizer.from_folder(minilm_dir).encode(_short_texts(96))
    fp32 = ReferenceEncoder.from_folder(minilm_dir).embed(rows)
    got = np.concatenate([engine.embed(rows[i : i + 32]) for i in range(0, len(rows), 32)])
    assert _cosines(got, fp32).min() >= 0.99
    # every row alone gives the bits it got among 31 others
    alone = np.concatenate([engine.embed([row]) for row in rows[:32]])
    assert alone.tobytes() == got[:32].tobytes()
    assert batch_invariant(lambda _lane, batch: engine.embed(batch), "text", rows[:12])


def test_the_cpp_row_op_and_torch_ops_give_the_same_bits(minilm_int8: Path) -> None:
    if load_int8_kernels(QUIET) is not None:
        pytest.skip(f"no int8 row op here: {load_int8_kernels(QUIET)}")
    reference = ReferenceEncoder.from_folder(minilm_int8)
    native = int8_encoder(reference, CpuDevice(), QUIET)
    fallback = int8_encoder(reference, CpuDevice(), QUIET, env={"VLLM_SRUN_INT8_KERNELS": "0"})
    assert native.kernels["row_steps"].startswith("one pass each")
    assert fallback.kernels["row_steps"].startswith("torch ops (turned off")
    rows = TextTokenizer.from_folder(minilm_int8).encode(_short_texts(40))
    assert native.embed(rows).tobytes() == fallback.embed(rows).tobytes()


def test_the_whole_forward_in_one_call_gives_the_int8_layer_loops_bits(minilm_int8: Path) -> None:
    """`srun_cpu::encode` on an int8 package's linears (`int8_layers`): each row's hidden states are
    the Python layer loop's bits on 1 and 2 threads, the engine serves embeddings through it (the card
    says so), and int8 linears whose row steps are torch ops keep the loop."""
    from vllm_srun.adapters.engines.cpu_int8 import ONE_CALL_CARD
    from vllm_srun.adapters.engines.cpu_op_library import cpu_ops, load_varlen_attention
    from vllm_srun.adapters.models.encoder_arch import hidden_states
    from vllm_srun.adapters.models.unpadded import PackedRows
    from vllm_srun.domain.worker.kernels import bucket_rows

    if load_varlen_attention(QUIET) is not None or load_int8_kernels(QUIET) is not None:
        pytest.skip("no C++ ops here: the int8 forward keeps the layer loop")
    reference = ReferenceEncoder.from_folder(minilm_int8)
    ops = lambda: cpu_ops(torch.float32, QUIET)  # noqa: E731
    engine = int8_encoder(reference, CpuDevice(), QUIET, cpu_ops=ops)
    assert engine.kernels["layers"] == ONE_CALL_CARD
    tokenizer = TextTokenizer.from_folder(minilm_int8)
    texts = [f"entry {i} reads " + "further words " * ((i * 5) % 30) for i in range(12)]
    threads = torch.get_num_threads()
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            for batch in (tokenizer.encode(texts[:1]), tokenizer.encode(texts[:5]), tokenizer.encode(texts)):
                tokens = sum(len(r.ids) for r in batch)
                rows = PackedRows.build(batch, reference.device, None)
                with torch.inference_mode():
                    want = hidden_states(reference.encoder, rows, engine.int8, engine.ops)  # the layer loop
                    got = engine.ops.encode(reference.encoder, engine.int8, batch, bucket_rows(tokens), "none", False)
                assert got is not None and got.shape[0] == bucket_rows(tokens)
                start = 0
                for i, row in enumerate(batch):
                    first = int(rows.starts[rows.inverse[i]])
                    mine = got[start : start + len(row.ids)]
                    assert torch.equal(mine, want[first : first + len(row.ids)]), (count, i)
                    start += len(row.ids)
    finally:
        torch.set_num_threads(threads)
    calls = []
    encode = engine.ops.encode
    engine.ops.encode = lambda *args: calls.append(1) or encode(*args)  # type: ignore[method-assign]
    batch = tokenizer.encode(_short_texts(9))
    got = engine.embed(batch)
    assert calls == [1]
    fallback = int8_encoder(reference, CpuDevice(), QUIET, cpu_ops=ops, env={"VLLM_SRUN_INT8_KERNELS": "0"})
    assert fallback.ops.encode(reference.encoder, fallback.int8, batch, 256, "mean", True) is None
    assert fallback.kernels["layers"] != ONE_CALL_CARD
    assert np.abs(got - fallback.embed(batch)).max() < 1e-6  # the same hidden states, pooled in torch there


def test_the_golden_check_holds_when_fp32_kernels_round_differently(
    minilm_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Recorded with the one-call attention op, checked with SDPA per run (a machine without a
    compiler): last-bit differences around the int8 linears move MiniLM's answers past the CPU
    class's 1e-3, not past the package's own tolerance."""
    from vllm_srun.adapters.engines.cpu_op_library import load_varlen_attention

    if load_varlen_attention(QUIET) is not None:
        pytest.skip("no one-call attention op here: nothing rounds differently")
    out = quantize(str(minilm_dir), tmp_path / "minilm-int8", progress=QUIET, store=session_store())
    monkeypatch.setenv("VLLM_SRUN_CPU_ATTENTION", "0")
    with serving([out]) as (client, _):
        card = client.get("/v1/models").json()["data"][0]
    assert card["kernels"]["attention"].startswith("sdpa")
    assert card["golden"]["status"] == "matched" and card["golden"]["tolerance"] == GOLDEN_TOLERANCE


class _Gpu:
    kind, index, name, torch_device, native_dtypes = "cuda", 0, "cuda:0", "cuda:0", frozenset({"float32"})


def test_refused_in_one_line_where_int8_cannot_run(tiny_int8) -> None:  # type: ignore[no-untyped-def]
    _, out = tiny_int8
    reference = ReferenceEncoder.from_folder(out)
    for device, flags, words in (
        (CpuDevice(), frozenset({"avx2", "avx512f"}), "avx512_vnni"),
        (_Gpu(), None, "device cuda"),
    ):
        with pytest.raises(EngineRefused, match=words) as err:
            int8_encoder(reference, device, QUIET, flags=flags)
        assert "\n" not in str(err.value)
    with pytest.raises(EngineRefused, match="does not serve int8 packages"):
        OnnxRuntimePlugin().build(EngineRequest("encoder", reference, CpuDevice()), QUIET)
    # through a server: the model fails at load with that line as its reason
    for settings, args, words in (
        ({"engine": "onnxruntime"}, EngineArgs(), "does not serve int8 packages"),
        ({}, EngineArgs(dtype="bfloat16"), "in float32 (asked: bfloat16)"),
    ):
        with serving([(out, args)], **settings) as (client, _):
            card = client.get("/v1/models").json()["data"][0]
        assert card["status"] == "failed" and words in card["reason"]
