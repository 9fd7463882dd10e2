"""The official `cohere` client's `ClientV2.embed`, unmodified, against a real `vllm-srun serve`
process (issue 24): floats equal to `/v1/embeddings`, quantized types equal to
sentence-transformers' `quantize_embeddings`, a bad field a `BadRequestError`; and
docs/examples/embedding_outputs.py runs against the same server."""

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
cohere = pytest.importorskip("cohere")
quantization = pytest.importorskip("sentence_transformers.util.quantization")
TEXTS = ["paris is the capital of france", "a small cat", "x"]


@pytest.fixture(scope="module")
def server(encoder_fixture) -> Iterator[str]:  # type: ignore[no-untyped-def]
    with running_server(str(encoder_fixture("colbert")), str(encoder_fixture("splade"))) as base:
        yield base


def test_cohere_client_embed_works_unmodified(server: str) -> None:
    client = cohere.ClientV2(base_url=server, api_key="x")
    got = client.embed(
        model="tiny-colbert",
        texts=TEXTS,
        input_type="search_document",
        embedding_types=["float", "int8", "ubinary"],
    )
    v1 = httpx.post(f"{server}/v1/embeddings", json={"model": "tiny-colbert", "input": TEXTS}).json()
    floats = np.array([d["embedding"] for d in v1["data"]], dtype=np.float32)
    assert np.array_equal(np.array(got.embeddings.float_, dtype=np.float32), floats)
    fixed = np.array([[-1.0] * floats.shape[1], [1.0] * floats.shape[1]])
    for name in ("int8", "ubinary"):
        theirs = quantization.quantize_embeddings(floats, name, ranges=fixed)
        assert np.array(getattr(got.embeddings, name), dtype=theirs.dtype).tobytes() == theirs.tobytes()
    assert got.texts == TEXTS and got.meta.billed_units.input_tokens == v1["usage"]["prompt_tokens"]


def test_cohere_client_sees_a_bad_request(server: str) -> None:
    client = cohere.ClientV2(base_url=server, api_key="x")
    with pytest.raises(cohere.BadRequestError) as caught:
        client.embed(model="tiny-colbert", texts=["cat " * 300], input_type="search_query", truncate="NONE")
    assert "truncate" in str(caught.value.body)


def test_embedding_outputs_example(server: str) -> None:
    example = Path(__file__).resolve().parents[2] / "docs" / "examples" / "embedding_outputs.py"
    out = subprocess.run(
        [sys.executable, str(example), server, "tiny-splade", "tiny-colbert"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("sparse: 5 terms") and lines[1].startswith("multi_vector: ")
    assert lines[3] == "int8: 32 values, ranges from fixed" and lines[4] == "cohere: float 32, ubinary 4 bytes"


def test_generated_requests_to_the_output_routes_never_get_a_5xx(encoder_fixture) -> None:  # type: ignore[no-untyped-def]
    from tests.e2e.test_openapi_fuzz import fuzz

    with running_server(
        str(encoder_fixture("colbert")), "--result-cache-entries", "0"
    ) as base:  # one model: no name needed
        failures, statuses = fuzz(base, ("/v1/embeddings", "/v2/embed", "/v1/rerank"), examples=30)
    assert failures == []
    assert len(statuses) >= 45 and 200 in statuses
