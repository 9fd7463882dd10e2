"""The encoder family end to end: `vllm-srun fixture` writes the packages, `vllm-srun serve`
serves them as a real process, and the official `cohere` client's rerank calls (v1 and v2)
work against it unmodified. Refusals exit before any load (R-ARG-2, R-DT)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.e2e.server import running_server

pytestmark = pytest.mark.slow

CLI = [sys.executable, "-m", "vllm_srun.app.cli"]
DOCS = [
    "paris is the capital of france",
    "the river flows to the sea",
    "a small cat",
    "money in the bank account",
    "the weather today is rain",
]
QUERY = "what is the capital city of france"


@pytest.fixture(scope="module")
def reranker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cli") / "tiny-reranker"
    done = subprocess.run(
        [*CLI, "fixture", str(out), "--family", "encoder", "--variant", "rerank", "--seed", "7"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(out) and (out / "golden.json").exists() and (out / "srun.json").exists()
    return out


@pytest.fixture(scope="module")
def server(reranker: Path, encoder_fixture) -> Iterator[str]:  # type: ignore[no-untyped-def]
    with running_server(str(reranker), str(encoder_fixture("classify"))) as base:
        yield base


def _reference_scores(folder: Path) -> np.ndarray:
    from vllm_srun.adapters.models.reference_encoder import ReferenceEncoder
    from vllm_srun.adapters.models.tokenization import TextTokenizer

    runner, tok = ReferenceEncoder.from_folder(folder), TextTokenizer.from_folder(folder)
    logits = np.concatenate([runner.classify_logits(tok.encode_pairs([(QUERY, d)])) for d in DOCS])[:, 0]
    return 1 / (1 + np.exp(-logits.astype(np.float64)))


def test_cohere_v2_client_rerank(server: str, reranker: Path) -> None:
    import cohere

    co = cohere.ClientV2(api_key="unused", base_url=server)
    res = co.rerank(model="tiny-reranker", query=QUERY, documents=DOCS, top_n=3)
    want = _reference_scores(reranker)
    assert len(res.results) == 3 and res.id
    assert [r.index for r in res.results] == list(np.argsort(-want, kind="stable")[:3])
    for r in res.results:
        assert abs(r.relevance_score - want[r.index]) < 1e-5


def test_cohere_v1_client_rerank_with_documents(server: str, reranker: Path) -> None:
    import cohere

    co = cohere.Client(api_key="unused", base_url=server)
    res = co.rerank(model="tiny-reranker", query=QUERY, documents=DOCS, return_documents=True)
    assert sorted(r.index for r in res.results) == list(range(len(DOCS)))
    scores = [r.relevance_score for r in res.results]
    assert scores == sorted(scores, reverse=True)
    # /v1/rerank is the upstream contract's too: a document sent as a string comes back as that
    # string, which the client reads as it is (R-API-11, docs/contract.md) ...
    assert all(r.document == DOCS[r.index] for r in res.results)
    # ... and one sent in Cohere's object form comes back in it: `document.text`
    objects = co.rerank(
        model="tiny-reranker", query=QUERY, documents=[{"text": d} for d in DOCS], return_documents=True
    )
    assert [r.index for r in objects.results] == [r.index for r in res.results]
    assert all(r.document is not None and r.document.text == DOCS[r.index] for r in objects.results)


def test_cards_golden_and_unsupported_surface(server: str) -> None:
    cards = {c["id"]: c for c in httpx.get(f"{server}/v1/models").json()["data"]}
    assert cards["tiny-reranker"]["golden"]["status"] == "matched"
    assert cards["tiny-classify"]["golden"]["status"] == "matched"
    r = httpx.post(f"{server}/v2/rerank", json={"model": "tiny-classify", "query": "q", "documents": ["d"]})
    assert r.status_code == 422 and r.json()["error"]["code"] == "unsupported_surface"


def test_bfloat16_run_is_unverified(encoder_fixture) -> None:  # type: ignore[no-untyped-def]
    with running_server(str(encoder_fixture("classify")), "--dtype", "bfloat16") as base:
        card = httpx.get(f"{base}/v1/models").json()["data"][0]
        assert card["dtype"] == "bfloat16" and card["ready"]
        assert card["golden"]["status"] == "unverified" and "bfloat16" in card["golden"]["reason"]
        assert httpx.post(f"{base}/v1/classify", json={"input": "hello"}).status_code == 200


def test_minilm_ships_a_golden_file_that_matches(minilm_server: str) -> None:
    card = httpx.get(f"{minilm_server}/v1/models").json()["data"][0]
    assert card["golden"]["status"] == "matched" and card["golden"]["checked"] == 2


@pytest.mark.parametrize(
    ("flags", "why"),
    [
        (["--dtype", "float16"], "float16"),
        (["--engine", "onnxruntime", "--dtype", "bfloat16"], "onnxruntime"),
        (["--result-cache-entries", "-1"], "result-cache-entries"),
    ],
)
def test_refused_before_any_load(flags: list[str], why: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [*CLI, "serve", str(tmp_path / "not-even-read"), *flags], capture_output=True, text=True, timeout=60
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1 and why in lines[0], done.stderr
    assert "load:" not in done.stderr


def test_repeated_request_is_answered_from_the_cache(server: str) -> None:
    def counts() -> tuple[float, float]:
        text = httpx.get(f"{server}/metrics").text
        hits = sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("vllm_srun_result_cache_total")
            and 'model="tiny-classify"' in line
            and 'outcome="hit"' in line
        )
        forwards = sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("vllm_srun_forwards_total") and 'model="tiny-classify"' in line
        )
        return hits, forwards

    body = {"model": "tiny-classify", "input": ["asked twice over http"]}
    first = httpx.post(f"{server}/v1/classify", json=body).json()
    hits, forwards = counts()
    again = httpx.post(f"{server}/v1/classify", json=body).json()
    assert again == first and counts() == (hits + 1, forwards)
