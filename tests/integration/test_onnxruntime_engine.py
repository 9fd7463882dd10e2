"""The ONNX Runtime engine (R-DEV-3, `--engine onnxruntime`): parity with the native engine and with
`transformers`, the export cache, a package's own `model.onnx`, and the engine serving embeddings,
classify and rerank in-process through the same scheduler."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.integration.serving import serving
from vllm_srun.adapters.contracts import EngineRefused, EngineRequest, quiet
from vllm_srun.adapters.devices.torch_devices import CpuDevice, TorchGpuDevice
from vllm_srun.adapters.engines.onnx_export import export_encoder
from vllm_srun.adapters.engines.registry import EngineRegistry
from vllm_srun.adapters.models.reference_encoder import ReferenceEncoder
from vllm_srun.adapters.models.tokenization import TextTokenizer
from vllm_srun.domain.settings.engine_args import EngineArgs

TOL = 1e-4
TEXTS = [
    "this movie is great fun",
    "bad",
    "the plot was boring and the acting was terrible " * 3,
    "a b c d e f g",
    "is it raining today",
    "paris is the capital of france",
]
PAIRS = [
    ("capital of france", "paris is the capital of france"),
    ("capital of france", "a small cat"),
    ("is the movie fun", "the movie was great fun " * 5),
]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("engines")


def _engine(reference: ReferenceEncoder, cache: Path, key: str | None, onnx_file: Path | None = None):  # type: ignore[no-untyped-def]
    request = EngineRequest(
        "encoder", reference, CpuDevice(), threads=2, package_sha256=key, package_graph=onnx_file, cache_dir=cache
    )
    return EngineRegistry().build("onnxruntime", request, quiet)


def test_embeddings_match_native_on_minilm(minilm_dir: Path, cache: Path) -> None:
    reference, tok = ReferenceEncoder.from_folder(minilm_dir), TextTokenizer.from_folder(minilm_dir)
    ort = _engine(reference, cache, "minilm-test")
    assert ort.name == "onnxruntime" and ort.kernel_switch_tokens is None
    for batch in (TEXTS, TEXTS[:1], [TEXTS[2]] * 3, ["word " * 250]):
        rows = tok.encode(batch, max_length=256, truncate=True)
        got, want = ort.embed(rows), reference.embed(rows)
        assert got.dtype == np.float32 and got.shape == want.shape and np.abs(got - want).max() <= TOL


def _transformers_logits(folder: Path, rows) -> np.ndarray:  # type: ignore[no-untyped-def]
    import transformers

    model = transformers.BertForSequenceClassification.from_pretrained(folder).eval()
    with torch.no_grad():
        return np.stack(
            [
                model(input_ids=torch.tensor([r.ids]), token_type_ids=torch.tensor([r.type_ids])).logits[0].numpy()
                for r in rows
            ]
        )


@pytest.mark.parametrize("variant", ["classify", "multilabel", "rerank"])
def test_logits_match_native_and_transformers(encoder_fixture, cache: Path, variant: str) -> None:  # type: ignore[no-untyped-def]
    folder = encoder_fixture(variant)
    reference, tok = ReferenceEncoder.from_folder(folder), TextTokenizer.from_folder(folder)
    ort = _engine(reference, cache, f"fixture-{variant}")
    rows = tok.encode_pairs(PAIRS) if variant == "rerank" else tok.encode(TEXTS, max_length=128, truncate=True)
    got = ort.classify_logits(rows)
    assert np.abs(got - reference.classify_logits(rows)).max() <= TOL
    assert np.abs(got - _transformers_logits(folder, rows)).max() <= TOL
    assert np.abs(ort.embed(rows) - reference.embed(rows)).max() <= TOL  # the pooled output rides along


def test_the_export_is_cached_by_package_hash(encoder_fixture, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    reference = ReferenceEncoder.from_folder(encoder_fixture("embed"))
    first = _engine(reference, tmp_path, "f" * 64)
    second = _engine(reference, tmp_path, "f" * 64)
    assert first.describe()["kernels"]["graph"] == "exported"
    assert second.describe()["kernels"]["graph"] == "exported (cached)"
    files = list((tmp_path / "onnx").iterdir())
    assert len(files) == 1 and files[0].name.startswith("f" * 40) and files[0].suffix == ".onnx"
    uncached = _engine(reference, tmp_path, None)  # no key: a temporary export, gone once loaded
    assert uncached.describe()["kernels"]["graph"] == "exported" and len(list((tmp_path / "onnx").iterdir())) == 1


def test_a_package_graph_is_used_when_it_fits(encoder_fixture, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    folder = tmp_path / "pkg"
    shutil.copytree(encoder_fixture("embed"), folder)
    reference, tok = ReferenceEncoder.from_folder(folder), TextTokenizer.from_folder(folder)
    # a graph that returns the last hidden state, as third-party exports do: pooled with the package's pooling
    ids = torch.ones(2, 5, dtype=torch.long)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's notes on Python-side shape checks
        torch.onnx.export(
            reference.encoder,
            (ids, torch.ones_like(ids), torch.zeros_like(ids)),
            str(folder / "model.onnx"),
            dynamo=False,
            input_names=["input_ids", "attention_mask", "token_type_ids"],
            output_names=["last_hidden_state"],
            opset_version=17,
            dynamic_axes={
                n: {0: "b", 1: "t"} for n in ("input_ids", "attention_mask", "token_type_ids", "last_hidden_state")
            },
        )
    ort = _engine(reference, tmp_path / "cache", "pkg", onnx_file=folder / "model.onnx")
    assert ort.describe()["kernels"]["graph"] == "package model.onnx"
    rows = tok.encode(TEXTS, max_length=128, truncate=True)
    assert np.abs(ort.embed(rows) - reference.embed(rows)).max() <= TOL
    # a classifier needs logits: a graph without them is set aside for our export
    clf = ReferenceEncoder.from_folder(encoder_fixture("classify"))
    fallback = _engine(clf, tmp_path / "cache", "clf", onnx_file=folder / "model.onnx")
    assert fallback.describe()["kernels"]["graph"] == "exported"


def test_a_gpu_needs_its_execution_provider_and_fp32(encoder_fixture, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    reference = ReferenceEncoder.from_folder(encoder_fixture("embed"))
    import onnxruntime

    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():  # this machine's CPU build
        with pytest.raises(EngineRefused, match="needs onnxruntime's CUDAExecutionProvider, which this build") as no:
            request = EngineRequest("encoder", reference, TorchGpuDevice("cuda", 0), cache_dir=tmp_path)
            EngineRegistry().build("onnxruntime", request, quiet)
        assert "install onnxruntime-gpu" in str(no.value) and "\n" not in str(no.value)
    with pytest.raises(ValueError, match="FP32"):
        export_encoder(
            ReferenceEncoder.from_folder(encoder_fixture("embed"), dtype=torch.bfloat16), tmp_path / "x.onnx"
        )
    with pytest.raises(ValueError, match="unknown engine"):
        EngineRegistry().build("tensorrt", EngineRequest("encoder", reference, CpuDevice(), cache_dir=tmp_path), quiet)
    with pytest.raises(ValueError, match="encoder models only"):
        EngineRegistry().build(
            "onnxruntime", EngineRequest("decoder", reference, CpuDevice(), cache_dir=tmp_path), quiet
        )


def test_server_with_the_onnxruntime_engine_answers_every_surface(encoder_fixture) -> None:  # type: ignore[no-untyped-def]
    folders = [encoder_fixture(v) for v in ("embed", "classify", "rerank")]
    with serving(folders, engine="onnxruntime") as (client, rt):
        cards = {c["id"]: c for c in client.get("/v1/models").json()["data"]}
        for name in ("tiny-embed", "tiny-classify", "tiny-rerank"):
            card = cards[name]
            assert card["ready"] and card["engine"] == "onnxruntime" and card["golden"]["status"] == "matched"
            assert card["kernels"]["runtime"].startswith("onnxruntime") and card["caps"][0]["accounting"] == "padded"
        r = client.post(
            "/v1/embeddings",
            json={"model": "tiny-embed", "input": ["a cat", "the dog"], "options": {"return_meta": True}},
        )
        assert r.status_code == 200 and r.json()["meta"]["engine"] == "onnxruntime" and len(r.json()["data"]) == 2
        reference = ReferenceEncoder.from_folder(folders[0])
        want = reference.embed(TextTokenizer.from_folder(folders[0]).encode(["a cat", "the dog"]))
        assert np.abs(np.array([d["embedding"] for d in r.json()["data"]]) - want).max() <= TOL
        r = client.post("/v1/classify", json={"model": "tiny-classify", "input": TEXTS[:3]})
        assert r.status_code == 200 and len(r.json()["results"]) == 3
        r = client.post(
            "/v1/rerank", json={"model": "tiny-rerank", "query": "capital", "documents": ["paris", "cat", "sea"]}
        )
        assert r.status_code == 200 and len(r.json()["results"]) == 3
        assert rt.models["tiny-embed"].scheduler_loop is not None
    # a dtype other than auto never reaches ONNX Runtime (the CLI refuses it first; a load says why)
    with serving([(folders[1], EngineArgs(dtype="bfloat16"))], engine="onnxruntime") as (client, _):
        card = client.get("/v1/models").json()["data"][0]
        assert card["status"] == "failed" and "dtype auto" in card["reason"]


@pytest.mark.parametrize(
    ("kind", "available", "chosen"),
    [
        ("cpu", ["CPUExecutionProvider"], ["CPUExecutionProvider"]),
        (
            "cuda",
            ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"],
            [("CUDAExecutionProvider", {"device_id": 1}), "CPUExecutionProvider"],
        ),
        (
            "rocm",
            ["MIGraphXExecutionProvider", "CPUExecutionProvider"],
            [("MIGraphXExecutionProvider", {"device_id": 1}), "CPUExecutionProvider"],
        ),
        (
            "rocm",
            ["ROCMExecutionProvider", "MIGraphXExecutionProvider", "CPUExecutionProvider"],
            [("ROCMExecutionProvider", {"device_id": 1}), "CPUExecutionProvider"],
        ),
    ],
)
def test_the_gpus_execution_provider_when_the_build_has_it(kind: str, available: list[str], chosen: list) -> None:  # type: ignore[type-arg]
    from tests.fakes import FakeDevice
    from vllm_srun.adapters.engines.onnxruntime import execution_providers

    device = FakeDevice(kind=kind, index=None if kind == "cpu" else 1)
    assert execution_providers(device, available, "1.23.0") == chosen


@pytest.mark.parametrize(
    ("kind", "why"),
    [
        ("cuda", "the onnxruntime engine on cuda:0 needs onnxruntime's CUDAExecutionProvider, which this build "
         "(onnxruntime 1.23.0: CPUExecutionProvider) lacks; install onnxruntime-gpu"),
        ("rocm", "needs onnxruntime's ROCMExecutionProvider or MIGraphXExecutionProvider"),
        ("mps", "the onnxruntime engine has no execution provider for mps devices (device mps); use --engine native"),
    ],
)  # fmt: skip
def test_a_missing_provider_is_refused_with_one_line_naming_it(kind: str, why: str) -> None:
    from tests.fakes import FakeDevice
    from vllm_srun.adapters.engines.onnxruntime import execution_providers
    from vllm_srun.adapters.engines.plugins import OnnxRuntimePlugin

    device = FakeDevice(kind=kind, index=None if kind == "mps" else 0)
    with pytest.raises(EngineRefused) as refused:
        execution_providers(device, ["CPUExecutionProvider"], "1.23.0")
    assert why in str(refused.value) and "\n" not in str(refused.value)
    if kind == "mps":  # no onnxruntime build has it: refused before any weights load, whatever is installed
        assert OnnxRuntimePlugin().device_refusal(device) == str(refused.value)
    assert OnnxRuntimePlugin().device_refusal(FakeDevice(kind="cpu")) is None
