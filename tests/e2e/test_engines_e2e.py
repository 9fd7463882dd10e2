"""Engines end to end (R-DEV-3, R-DT-3 b): a real `vllm-srun serve --engine onnxruntime` process
answers embeddings, classify and rerank (within 1e-4 of the native engine), and the native
engine's card says which linear kernels serve. The refusal of `--engine onnxruntime --dtype
bfloat16` before any load is in test_encoder_e2e.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.e2e.server import running_server
from vllm_srun.adapters.models.reference_encoder import ReferenceEncoder
from vllm_srun.adapters.models.tokenization import TextTokenizer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def onnx_server(encoder_fixture, engine_cache: Path) -> Iterator[str]:  # type: ignore[no-untyped-def]
    folders = [str(encoder_fixture(v)) for v in ("embed", "classify", "rerank")]
    with running_server(*folders, "--engine", "onnxruntime") as base:
        yield base
    assert len(list((engine_cache / "onnx").glob("*.onnx"))) >= 3  # the server cached its exports there


def test_onnxruntime_server_answers_every_surface(onnx_server: str, encoder_fixture) -> None:  # type: ignore[no-untyped-def]
    cards = {c["id"]: c for c in httpx.get(f"{onnx_server}/v1/models").json()["data"]}
    assert {c["engine"] for c in cards.values()} == {"onnxruntime"}
    assert all(c["ready"] and c["golden"]["status"] == "matched" for c in cards.values())

    texts = ["the cat sat on the mat", "a quick brown fox", "x"]
    r = httpx.post(f"{onnx_server}/v1/embeddings", json={"model": "tiny-embed", "input": texts})
    assert r.status_code == 200
    folder = encoder_fixture("embed")
    want = ReferenceEncoder.from_folder(folder).embed(TextTokenizer.from_folder(folder).encode(texts))
    assert np.abs(np.array([d["embedding"] for d in r.json()["data"]]) - want).max() <= 1e-4

    r = httpx.post(f"{onnx_server}/v1/classify", json={"model": "tiny-classify", "input": ["great fun", "bad plot"]})
    assert r.status_code == 200 and [len(x["probabilities"]) for x in r.json()["results"]] == [3, 3]

    query, docs = "capital of france", ["paris is the capital of france", "a small cat", "the sea"]
    r = httpx.post(f"{onnx_server}/v1/rerank", json={"model": "tiny-rerank", "query": query, "documents": docs})
    assert r.status_code == 200
    folder = encoder_fixture("rerank")
    logits = ReferenceEncoder.from_folder(folder).classify_logits(
        TextTokenizer.from_folder(folder).encode_pairs([(query, d) for d in docs])
    )[:, 0]
    for res in r.json()["results"]:
        assert abs(res["relevance_score"] - 1 / (1 + np.exp(-float(logits[res["index"]])))) <= 1e-4


def test_native_card_names_its_linear_kernels(minilm_server: str) -> None:
    card = httpx.get(f"{minilm_server}/v1/models").json()["data"][0]
    assert card["engine"] == "native" and card["kernels"]["linear"] in ("onednn_packed", "eager")
    assert card["kernels"]["reason"] and card["golden"]["status"] == "matched"
    # a compiler is on every machine the suite runs on: MiniLM's attention runs in one call
    assert card["kernels"]["attention"] == "one call for every row (C++ varlen op)", card["kernels"]
    assert card["kernels"]["add_norm"] == "residual add + LayerNorm in one pass (C++ op)", card["kernels"]
    if card["kernels"]["linear"] == "onednn_packed":  # MiniLM is a BERT: its layers run in one call
        assert card["kernels"]["layers"].startswith("every BERT-shaped packed layer in one C++ call"), card["kernels"]
