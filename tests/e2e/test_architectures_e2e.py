"""Every encoder architecture end to end through HTTP, against the test-only references.

`vllm-srun fixture` writes a tiny package of each architecture and kind (its tokenizer of the real
kind, its config as transformers writes it), one `vllm-srun serve` process serves them all, and
each answer is compared with `transformers` / `sentence-transformers` run on the same folder with
their own tokenizer class (tokenizer included, end to end): embeddings with
`SentenceTransformer.encode`, classify probabilities with `AutoModelForSequenceClassification`,
cross-encoder relevance as sigmoid(logit), decoder rerankers as the Qwen3-Reranker recipe
(P(yes) against P(no) of the next token after the template). Requests carry several texts of
mixed lengths, and run concurrently, so rows share forwards. The card reports the
batch-invariance probe's verdict for each model.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.e2e.server import running_server

pytestmark = pytest.mark.slow

CLI = [sys.executable, "-m", "vllm_srun.app.cli"]
ENCODERS = ["roberta", "xlm-roberta", "distilbert", "mpnet", "deberta-v2", "modernbert"]
DECODERS = ["qwen3", "qwen2", "llama"]
VARIANTS = [f"{a}-{k}" for a in ENCODERS for k in ("embed", "classify", "rerank")] + [
    f"{a}-{k}" for a in DECODERS for k in ("embed", "rerank")
]
TEXTS = [
    "the cat sat on the mat",
    "A quick brown fox jumps over the lazy dog while seven small birds sing today",
    "x",
    "Café naïve façade: déjà vu! 東京 🙂 42,000 — ok?",
    "the movie was great fun and the music was good but the plot was boring " * 3,
]
QUERY = "what is the capital of france"
DOCS = ["paris is the capital of france", "the river flows to the sea", "a small cat", "bank account money refund"]
TOL = 1e-5
DECODER_TOL = 1e-4


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("arch")
    out = {}
    for variant in VARIANTS:
        folder = root / variant
        done = subprocess.run(
            [*CLI, "fixture", str(folder), "--family", "encoder", "--variant", variant, "--seed", "5", "--no-golden"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        out[variant] = folder
    return out


@pytest.fixture(scope="module")
def server(packages: dict[str, Path]) -> Iterator[str]:
    with running_server(*(str(p) for p in packages.values()), ready_timeout=600) as base:
        yield base


def _post(base: str, path: str, body: dict) -> dict:
    r = httpx.post(f"{base}{path}", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _embeddings_reference(folder: Path) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(folder), device="cpu")
    return model.encode(TEXTS, convert_to_numpy=True, batch_size=len(TEXTS))


@pytest.mark.parametrize("arch", ENCODERS + DECODERS)
def test_embeddings_match_sentence_transformers(server: str, packages: dict[str, Path], arch: str) -> None:
    name = f"{arch}-embed"
    want = _embeddings_reference(packages[name])
    with ThreadPoolExecutor(4) as pool:  # the same texts in concurrent requests: rows share forwards
        answers = list(pool.map(lambda _: _post(server, "/v1/embeddings", {"model": name, "input": TEXTS}), range(4)))
    tol = DECODER_TOL if arch in DECODERS else TOL
    for body in answers:
        got = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
        assert got.shape == want.shape
        assert float(np.abs(got - want).max()) <= tol, (name, float(np.abs(got - want).max()))


def _classify_reference(folder: Path) -> np.ndarray:
    """`AutoModelForSequenceClassification`'s softmax on each text, with its own tokenizer."""
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    model = transformers.AutoModelForSequenceClassification.from_pretrained(str(folder)).eval()
    with torch.inference_mode():
        return np.array([torch.softmax(model(**tok(t, return_tensors="pt")).logits[0], -1).numpy() for t in TEXTS])


@pytest.mark.parametrize("arch", ENCODERS)
def test_classify_matches_transformers(server: str, packages: dict[str, Path], arch: str) -> None:
    want = _classify_reference(packages[f"{arch}-classify"])
    body = _post(server, "/v1/classify", {"model": f"{arch}-classify", "input": TEXTS})
    got = np.array([r["probabilities"] for r in body["results"]])
    assert float(np.abs(got - want).max()) <= TOL


def _decoder_recipe_scores(folder: Path) -> np.ndarray:
    """The Qwen3-Reranker recipe with transformers: P(yes) / (P(yes) + P(no)) after the template."""
    import torch
    import transformers

    from vllm_srun.adapters.models.prompted_pairs import RerankPrompt

    template = RerankPrompt.from_manifest(json.loads((folder / "srun.json").read_text()))
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    yes, no = tok.convert_tokens_to_ids(template.yes), tok.convert_tokens_to_ids(template.no)
    out = []
    with torch.inference_mode():
        for doc in DOCS:
            ids = tok(template.render(QUERY, doc)[0], add_special_tokens=False, return_tensors="pt")
            logits = model(**ids).logits[0, -1]
            pair = torch.softmax(torch.stack([logits[no], logits[yes]]).double(), 0)
            out.append(float(pair[1]))
    return np.array(out)


def _cross_encoder_scores(folder: Path) -> np.ndarray:
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    model = transformers.AutoModelForSequenceClassification.from_pretrained(str(folder)).eval()
    with torch.inference_mode():
        logits = [float(model(**tok(QUERY, d, return_tensors="pt")).logits[0, 0]) for d in DOCS]
    return 1 / (1 + np.exp(-np.array(logits, dtype=np.float64)))


@pytest.mark.parametrize("arch", ENCODERS + DECODERS)
def test_rerank_matches_reference(server: str, packages: dict[str, Path], arch: str) -> None:
    folder = packages[f"{arch}-rerank"]
    want = _decoder_recipe_scores(folder) if arch in DECODERS else _cross_encoder_scores(folder)
    body = _post(server, "/v1/rerank", {"model": f"{arch}-rerank", "query": QUERY, "documents": DOCS})
    got = {r["index"]: r["relevance_score"] for r in body["results"]}
    tol = DECODER_TOL if arch in DECODERS else TOL
    assert max(abs(got[i] - want[i]) for i in range(len(DOCS))) <= tol


def test_cards_report_each_architecture(server: str, packages: dict[str, Path]) -> None:
    """Each model is ready, and its card says how its forwards run and what the probe found."""
    cards = {m["id"]: m for m in httpx.get(f"{server}/v1/models", timeout=30).json()["data"]}
    for variant in packages:
        card = cards[variant]
        assert card["status"] == "ready", (variant, card.get("status"))
        assert card["numerics"] in ("exact", "approximate"), (variant, card["numerics"])
        assert card["kernels"]["linear"] in ("onednn_packed", "eager"), (variant, card["kernels"])
        if variant.endswith("-rerank"):
            yes_no = variant.split("-rerank")[0] in DECODERS
            assert ("yes" in card["rerank"]) == yes_no, (variant, card["rerank"])


def test_onnxruntime_engine_serves_every_architecture(packages: dict[str, Path]) -> None:
    """`--engine onnxruntime` exports each architecture's padded forward and serves it: the same
    answers as sentence-transformers."""
    names = [f"{a}-embed" for a in ENCODERS + DECODERS]
    with running_server(*(str(packages[n]) for n in names), "--engine", "onnxruntime", ready_timeout=900) as base:
        cards = {m["id"]: m for m in httpx.get(f"{base}/v1/models", timeout=30).json()["data"]}
        for name in names:
            assert cards[name]["engine"] == "onnxruntime", cards[name]["engine"]
            want = _embeddings_reference(packages[name])
            body = _post(base, "/v1/embeddings", {"model": name, "input": TEXTS})
            got = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
            tol = DECODER_TOL if name.split("-embed")[0] in DECODERS else TOL
            assert float(np.abs(got - want).max()) <= tol, (name, float(np.abs(got - want).max()))


def test_deterministic_rows_are_bit_identical_alone_and_in_a_batch(packages: dict[str, Path]) -> None:
    """`--deterministic`: every architecture's probe is honest — a row's answer has the same bits
    alone and inside a batch of other rows (merged forwards only where the probe found them exact)."""
    names = [f"{a}-embed" for a in ENCODERS + DECODERS] + [f"{a}-classify" for a in ENCODERS]
    with running_server(*(str(packages[n]) for n in names), "--deterministic", ready_timeout=900) as base:
        cards = {m["id"]: m for m in httpx.get(f"{base}/v1/models", timeout=30).json()["data"]}
        for name in names:
            assert cards[name]["numerics"] == "deterministic", (name, cards[name]["numerics"])
            path, key = ("/v1/embeddings", "data") if name.endswith("-embed") else ("/v1/classify", "results")
            field = "embedding" if key == "data" else "probabilities"
            together = [r[field] for r in _post(base, path, {"model": name, "input": TEXTS})[key]]
            alone = [_post(base, path, {"model": name, "input": [t]})[key][0][field] for t in TEXTS]
            assert together == alone, name


def test_the_one_call_forward_serves_bert_shaped_architectures_like_transformers(packages: dict[str, Path]) -> None:
    """RoBERTa, XLM-RoBERTa and DistilBERT on the oneDNN packed linears (`VLLM_SRUN_ONEDNN=force`;
    tiny models otherwise keep eager where it times faster), so their embeddings and the RoBERTa
    classifiers' first tokens come from one C++ call (`srun_cpu::encode`: these fixtures have heads
    of 16; DistilBERT's classifier keeps the packed layer loop): the same answers as
    sentence-transformers and transformers, tokenizer included."""
    from vllm_srun.adapters.engines.cpu_op_library import VarlenOps, load_varlen_attention

    if load_varlen_attention(lambda _msg: None) is not None:
        pytest.skip("no C++ ops on this machine: the layer loop serves these")
    arches = ["roberta", "xlm-roberta", "distilbert"]
    names = [f"{a}-{k}" for a in arches for k in ("embed", "classify")]
    env = {"VLLM_SRUN_ONEDNN": "force"}
    with running_server(*(str(packages[n]) for n in names), env=env, ready_timeout=600) as base:
        cards = {m["id"]: m for m in httpx.get(f"{base}/v1/models", timeout=30).json()["data"]}
        for arch in arches:
            for name in (f"{arch}-embed", f"{arch}-classify"):
                kernels = cards[name]["kernels"]
                assert kernels["linear"] == "onednn_packed" and kernels["layers"] == VarlenOps.layers_card, kernels
            want = _embeddings_reference(packages[f"{arch}-embed"])
            body = _post(base, "/v1/embeddings", {"model": f"{arch}-embed", "input": TEXTS})
            got = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
            assert float(np.abs(got - want).max()) <= TOL, (arch, float(np.abs(got - want).max()))
            want = _classify_reference(packages[f"{arch}-classify"])
            body = _post(base, "/v1/classify", {"model": f"{arch}-classify", "input": TEXTS})
            got = np.array([r["probabilities"] for r in body["results"]])
            assert float(np.abs(got - want).max()) <= TOL, arch


def test_the_one_call_stacks_serve_modernbert_deberta_and_decoders_like_transformers(
    packages: dict[str, Path], tmp_path: Path
) -> None:
    """ModernBERT and DeBERTa (the fixtures' 2 heads of 16) and a Qwen3 embedder with 4 heads of 16
    on 2 K/V heads, on the oneDNN packed linears (`VLLM_SRUN_ONEDNN=force`), so every layer of their
    forwards runs in one C++ call (`srun_cpu::modernbert_layers`, `deberta_layers`,
    `decoder_layers`; the card says so): the same answers as sentence-transformers and
    transformers, tokenizer included."""
    from vllm_srun.adapters.engines.cpu_op_library import VarlenOps, load_varlen_attention
    from vllm_srun.adapters.families.fixtures.encoder_fixture import write_arch_package

    if load_varlen_attention(lambda _msg: None) is not None:
        pytest.skip("no C++ ops on this machine: the layer loop serves these")
    qwen3 = tmp_path / "qwen3-embed-16"
    qwen3.mkdir()
    write_arch_package(qwen3, "qwen3", "embed", 5, hidden=64, heads=4, kv_heads=2, intermediate=96)
    served = {n: packages[n] for n in ("modernbert-embed", "modernbert-classify", "deberta-v2-embed")}
    served["deberta-v2-classify"] = packages["deberta-v2-classify"]
    served["qwen3-embed-16"] = qwen3
    env = {"VLLM_SRUN_ONEDNN": "force"}
    with running_server(*(str(p) for p in served.values()), env=env, ready_timeout=600) as base:
        cards = {m["id"]: m for m in httpx.get(f"{base}/v1/models", timeout=30).json()["data"]}
        for name in served:
            kernels = cards[name]["kernels"]
            assert kernels["linear"] == "onednn_packed" and kernels["layers"] == VarlenOps.stack_card, (name, kernels)
        for name, tol in (("modernbert-embed", TOL), ("deberta-v2-embed", TOL), ("qwen3-embed-16", DECODER_TOL)):
            want = _embeddings_reference(served[name])
            body = _post(base, "/v1/embeddings", {"model": name, "input": TEXTS})
            got = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
            assert float(np.abs(got - want).max()) <= tol, (name, float(np.abs(got - want).max()))
        for name in ("modernbert-classify", "deberta-v2-classify"):
            want = _classify_reference(packages[name])
            body = _post(base, "/v1/classify", {"model": name, "input": TEXTS})
            got = np.array([r["probabilities"] for r in body["results"]])
            assert float(np.abs(got - want).max()) <= TOL, name
