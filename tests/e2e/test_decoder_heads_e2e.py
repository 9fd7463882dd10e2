"""Decoder classifiers, token heads and Qwen3.5 packages end to end through HTTP, against the
test-only references run on the same folders with their own tokenizer class.

`vllm-srun fixture` writes each package as transformers (or sentence-transformers) saves it; the
srun.json beside it is removed unless it carries a recipe (the Qwen3.5 yes/no reranker's), so the
server takes every package by what config.json says it is. One `vllm-srun serve` process serves the
Qwen3 / Qwen2 / Llama classifiers and token heads, another the Qwen3.5 ones (embeddings with
prompts, the yes/no rerank recipe, sequence and token classification). Requests carry texts of
mixed lengths and run concurrently, so rows share forwards.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.e2e.server import running_server

pytestmark = pytest.mark.slow

CLI = [sys.executable, "-m", "vllm_srun.app.cli"]
DECODERS = ["qwen3", "qwen2", "llama"]
DECODER_VARIANTS = [f"{a}-{k}" for a in DECODERS for k in ("classify", "token")]
QWEN3_5_VARIANTS = [f"qwen3_5-{k}" for k in ("embed", "rerank", "classify", "token")]
# a hybrid backbone has no four-linear blocks for the oneDNN packed copies: its server runs eager
# (until the native engine skips packing for such encoders on its own; see the h6 notes)
TEXTS = [
    "the cat sat on the mat",
    "A quick brown fox jumps over the lazy dog while seven small birds sing today",
    "x",
    "Café naïve façade: déjà vu! 東京 🙂 42,000 — ok?",
    "the movie was great fun and the music was good but the plot was boring " * 3,
]
QUERY = "what is the capital of france"
DOCS = ["paris is the capital of france", "the river flows to the sea", "a small cat", "bank account money refund"]
TOL = 1e-4


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("decoder-heads")
    out = {}
    for variant in DECODER_VARIANTS + QWEN3_5_VARIANTS:
        folder = root / variant
        done = subprocess.run(
            [*CLI, "fixture", str(folder), "--family", "encoder", "--variant", variant, "--seed", "7", "--no-golden"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        if not variant.endswith("-rerank"):
            (folder / "srun.json").unlink()  # nothing of ours: config.json says what the package is
        out[variant] = folder
    return out


@pytest.fixture(scope="module")
def decoders(packages: dict[str, Path]) -> Iterator[str]:
    with running_server(*(str(packages[v]) for v in DECODER_VARIANTS), ready_timeout=600) as base:
        yield base


@pytest.fixture(scope="module")
def qwen3_5(packages: dict[str, Path]) -> Iterator[str]:
    with running_server(*(str(packages[v]) for v in QWEN3_5_VARIANTS), ready_timeout=600) as base:
        yield base


def _post(base: str, path: str, body: dict) -> dict:
    r = httpx.post(f"{base}{path}", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _concurrently(base: str, path: str, body: dict, times: int = 4) -> list[dict]:
    with ThreadPoolExecutor(times) as pool:
        return list(pool.map(lambda _: _post(base, path, body), range(times)))


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _logits(folder: Path, kind: str, inputs: list[Any]) -> list[np.ndarray]:
    """transformers' logits of each input alone, with the package's tokenizer class."""
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    model = getattr(transformers, kind).from_pretrained(str(folder), dtype=torch.float32).eval()
    with torch.inference_mode():
        return [
            model(**tok(*(x if isinstance(x, tuple) else (x,)), return_tensors="pt")).logits[0].double().numpy()
            for x in inputs
        ]


def _check_classify(base: str, folder: Path, name: str) -> float:
    want = np.stack([_softmax(x) for x in _logits(folder, "AutoModelForSequenceClassification", TEXTS)])
    worst = 0.0
    for body in _concurrently(base, "/v1/classify", {"model": name, "input": TEXTS}):
        got = np.array([r["probabilities"] for r in body["results"]])
        worst = max(worst, float(np.abs(got - want).max()))
    return worst


def _expected_tokens(folder: Path, text: str, probs: np.ndarray) -> dict[tuple[int, int], tuple[int, float]]:
    """Each character span of TEXT's non-special tokens → (label index, probability) of its most
    probable token: byte-level pieces of one character share its span and are listed once."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    enc = tok(text, return_offsets_mapping=True, return_special_tokens_mask=True)
    best: dict[tuple[int, int], tuple[int, float]] = {}
    for (start, end), special, p in zip(enc["offset_mapping"], enc["special_tokens_mask"], probs, strict=True):
        if special:
            continue
        if (start, end) not in best or p.max() > best[start, end][1]:
            best[start, end] = (int(np.argmax(p)), float(p.max()))
    return best


def _check_tokens(base: str, folder: Path, name: str) -> tuple[float, int]:
    want = [
        _expected_tokens(folder, text, _softmax(x))
        for text, x in zip(TEXTS, _logits(folder, "AutoModelForTokenClassification", TEXTS), strict=True)
    ]
    worst, spans = 0.0, 0
    body_in = {"model": name, "input": TEXTS, "options": {"return_tokens": True}}
    for body in _concurrently(base, "/v1/classify", body_in):
        assert body["kind"] == "token"
        for result, expected in zip(body["results"], want, strict=True):
            assert sorted((t["start"], t["end"]) for t in result["tokens"]) == sorted(expected), name
            for token in result["tokens"]:
                label, probability = expected[token["start"], token["end"]]
                assert token["label"] == body["labels"][label], name
                worst = max(worst, abs(token["probability"] - probability))
            spans += len(result["spans"])
    return worst, spans


@pytest.mark.parametrize("arch", DECODERS)
def test_decoder_classifiers_match_transformers(decoders: str, packages: dict[str, Path], arch: str) -> None:
    gap = _check_classify(decoders, packages[f"{arch}-classify"], f"{arch}-classify")
    print(f"{arch}-classify HTTP vs transformers: {gap:.2e}")
    assert gap <= TOL


@pytest.mark.parametrize("arch", DECODERS)
def test_decoder_token_heads_match_transformers(decoders: str, packages: dict[str, Path], arch: str) -> None:
    gap, spans = _check_tokens(decoders, packages[f"{arch}-token"], f"{arch}-token")
    print(f"{arch}-token HTTP vs transformers: {gap:.2e}")
    assert gap <= TOL and spans > 0


def test_decoder_cards(decoders: str) -> None:
    cards = {m["id"]: m for m in httpx.get(f"{decoders}/v1/models", timeout=30).json()["data"]}
    for variant in DECODER_VARIANTS:
        card = cards[variant]
        assert card["status"] == "ready" and card["family"] == "encoder", (variant, card)
        assert card["numerics"] in ("exact", "approximate", "deterministic"), (variant, card["numerics"])
        kind = "token" if variant.endswith("-token") else "sequence"
        assert card["heads"][0]["kind"] == kind, (variant, card["heads"])


def test_qwen3_5_classify_and_token_heads(qwen3_5: str, packages: dict[str, Path]) -> None:
    gap = _check_classify(qwen3_5, packages["qwen3_5-classify"], "qwen3_5-classify")
    token_gap, spans = _check_tokens(qwen3_5, packages["qwen3_5-token"], "qwen3_5-token")
    print(f"qwen3_5 classify / token HTTP vs transformers: {gap:.2e} / {token_gap:.2e}")
    assert max(gap, token_gap) <= TOL and spans > 0


def test_qwen3_5_embeddings_with_prompts(qwen3_5: str, packages: dict[str, Path]) -> None:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(packages["qwen3_5-embed"]), device="cpu")
    for fields, prompt_name in (({}, None), ({"input_type": "query"}, "query"), ({"input_type": "document"}, None)):
        want = model.encode(TEXTS, prompt_name=prompt_name, batch_size=len(TEXTS))
        for body in _concurrently(qwen3_5, "/v1/embeddings", {"model": "qwen3_5-embed", "input": TEXTS, **fields}):
            got = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
            gap = float(np.abs(got - want).max())
            assert gap <= TOL, (fields, gap)
    print(f"qwen3_5-embed HTTP vs sentence-transformers: last gap {gap:.2e}")


def test_qwen3_5_yes_no_rerank_matches_the_recipe(qwen3_5: str, packages: dict[str, Path]) -> None:
    import torch
    import transformers

    from vllm_srun.adapters.models.prompted_pairs import RerankPrompt

    folder = packages["qwen3_5-rerank"]
    template = RerankPrompt.from_manifest(json.loads((folder / "srun.json").read_text()))
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    yes, no = tok.convert_tokens_to_ids(template.yes), tok.convert_tokens_to_ids(template.no)
    want = []
    with torch.inference_mode():
        for doc in DOCS:
            ids = tok(template.render(QUERY, doc)[0], add_special_tokens=False, return_tensors="pt")
            logits = model(**ids).logits[0, -1]
            want.append(float(torch.softmax(torch.stack([logits[no], logits[yes]]).double(), 0)[1]))
    body_in = {"model": "qwen3_5-rerank", "query": QUERY, "documents": DOCS}
    for body in _concurrently(qwen3_5, "/v1/rerank", body_in):
        got = {r["index"]: r["relevance_score"] for r in body["results"]}
        gap = max(abs(got[i] - want[i]) for i in range(len(DOCS)))
        assert gap <= TOL, gap
    print(f"qwen3_5-rerank HTTP vs the recipe: {gap:.2e}")
    cards = {m["id"]: m for m in httpx.get(f"{qwen3_5}/v1/models", timeout=30).json()["data"]}
    for variant in QWEN3_5_VARIANTS:
        assert cards[variant]["status"] == "ready", (variant, cards[variant])
    assert "yes" in cards["qwen3_5-rerank"]["rerank"]
