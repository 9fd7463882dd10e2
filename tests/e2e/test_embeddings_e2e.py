"""The walking skeleton end to end: a real `vllm-srun serve` process and real clients."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import numpy as np
import pytest

pytestmark = pytest.mark.slow

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The new movie is awesome.",
    "A cheetah is running behind its prey.",
    "Route this request to the billing team, please.",
    "x",
    "Is this prompt asking for medical advice about dosage of ibuprofen for children under five?",
]


def _metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_openai_client_embeddings(minilm_server: str, minilm_dir) -> None:
    import openai

    client = openai.OpenAI(base_url=f"{minilm_server}/v1", api_key="unused")
    # the client asks for base64 by default and decodes it; ask for floats too
    got = client.embeddings.create(model="all-MiniLM-L6-v2", input=SENTENCES)
    floats = client.embeddings.create(model="all-MiniLM-L6-v2", input=SENTENCES, encoding_format="float")
    a = np.array([d.embedding for d in got.data])
    b = np.array([d.embedding for d in floats.data])
    assert a.shape == (len(SENTENCES), 384)
    assert np.allclose(a, b, atol=1e-7)
    assert np.allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    assert [d.index for d in got.data] == list(range(len(SENTENCES)))
    assert got.usage.prompt_tokens > len(SENTENCES)
    # the published sentence-transformers example pair
    assert float(a[0] @ a[1]) == pytest.approx(0.755, abs=0.01)
    # the reference: our in-process encoder, one sentence at a time
    from vllm_srun.adapters.models.reference_encoder import ReferenceEncoder
    from vllm_srun.adapters.models.tokenization import TextTokenizer

    runner = ReferenceEncoder.from_folder(minilm_dir)
    tok = TextTokenizer.from_folder(minilm_dir)
    ref = np.stack([runner.embed(tok.encode([s], max_length=256))[0] for s in SENTENCES])
    assert np.abs(a - ref).max() < 1e-5
    # dimensions (Matryoshka-style cut, renormalised)
    short = client.embeddings.create(model="all-MiniLM-L6-v2", input="hello", dimensions=64, encoding_format="float")
    v = np.array(short.data[0].embedding)
    assert v.shape == (64,) and abs(np.linalg.norm(v) - 1) < 1e-5


def test_concurrent_requests_share_forwards(minilm_server: str) -> None:
    texts = [f"request number {i}: " + " ".join(["word"] * (i % 13 + 1)) for i in range(32)]

    def serial() -> list[list[float]]:
        out = []
        with httpx.Client(base_url=minilm_server, timeout=60) as c:
            for t in texts:
                r = c.post("/v1/embeddings", json={"input": t, "options": {"return_meta": True}})
                assert r.status_code == 200
                out.append(r.json()["data"][0]["embedding"])
        return out

    serial_vectors = serial()
    before = _metric(httpx.get(f"{minilm_server}/metrics").text, "vllm_srun_forwards_total")

    async def concurrent() -> list[dict]:
        async with httpx.AsyncClient(base_url=minilm_server, timeout=60) as c:
            rs = await asyncio.gather(
                *(c.post("/v1/embeddings", json={"input": t, "options": {"return_meta": True}}) for t in texts)
            )
        assert all(r.status_code == 200 for r in rs)
        return [r.json() for r in rs]

    bodies = asyncio.run(concurrent())
    after = _metric(httpx.get(f"{minilm_server}/metrics").text, "vllm_srun_forwards_total")
    forwards = after - before
    assert 1 <= forwards < len(texts), f"{forwards} forwards for {len(texts)} requests"
    assert max(b["meta"]["rows"] for b in bodies) == 1
    assert any(b["meta"]["padded_tokens"] > 8 * 3 for b in bodies)  # some request rode a shared forward
    got = np.array([b["data"][0]["embedding"] for b in bodies])
    assert np.abs(got - np.array(serial_vectors)).max() < 1e-5


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"this is not json", 400, "invalid_request"),
        (b'{"input": 42}', 400, "invalid_request"),
        (b'{"input": ["ok", 7]}', 400, "invalid_request"),
        (b'{"input": "ok", "colour": "blue"}', 400, "invalid_request"),
        (b'{"input": []}', 400, "invalid_request"),
        (b'{"input": "ok", "encoding_format": "int4"}', 400, "invalid_request"),
        (b'{"input": "ok", "embedding_type": "sparse"}', 400, "invalid_request"),
        (b'{"input": "ok", "options": {"deadline_ms": -1}}', 400, "invalid_request"),
        (b'{"input": "ok", "model": "no-such-model"}', 404, "model_not_found"),
        (b'{"input": "ok", "dimensions": 4096}', 400, "invalid_request"),
        (b'{"input": [{"type": "image_url", "image_url": {"url": "data:,"}}]}', 422, "unsupported_surface"),
        (json.dumps({"input": "word " * 400}).encode(), 400, "invalid_request"),
        (json.dumps({"input": "x" * 300_000}).encode(), 413, "request_too_large"),
    ],
)
def test_bad_input_gets_a_clear_error_and_costs_no_forward(
    minilm_server: str, body: bytes, status: int, code: str
) -> None:
    before = _metric(httpx.get(f"{minilm_server}/metrics").text, "vllm_srun_forwards_total")
    r = httpx.post(f"{minilm_server}/v1/embeddings", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == code and err["message"] and "\n" not in err["message"]
    assert "Traceback" not in r.text
    assert "server-timing" in r.headers
    after = _metric(httpx.get(f"{minilm_server}/metrics").text, "vllm_srun_forwards_total")
    assert after == before
    # and the server keeps serving
    ok = httpx.post(f"{minilm_server}/v1/embeddings", json={"input": "still here"})
    assert ok.status_code == 200


def test_truncate_when_asked(minilm_server: str) -> None:
    r = httpx.post(f"{minilm_server}/v1/embeddings", json={"input": "word " * 400, "options": {"overflow": "truncate"}})
    assert r.status_code == 200
    assert r.json()["usage"]["prompt_tokens"] == 256


def test_models_health_metrics_openapi_timing(minilm_server: str) -> None:
    models = httpx.get(f"{minilm_server}/v1/models").json()
    card = models["data"][0]
    assert card["id"] == "all-MiniLM-L6-v2" and card["family"] == "encoder" and card["ready"] is True
    args = card["engine_args"]
    assert args["max_num_seqs"] == 8192 and args["max_num_batched_tokens"] == 65536
    assert args["max_num_batched_tokens_source"] == "class" and args["batch_window_ms"] == 2.0
    assert card["limits"]["max_input_tokens"] == 256 and len(card["sha256"]) == 64
    assert httpx.get(f"{minilm_server}/health").json()["status"] == "ready"
    assert httpx.get(f"{minilm_server}/health/live").status_code == 200
    metrics = httpx.get(f"{minilm_server}/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    assert "vllm_srun_batch_rows_bucket" in metrics.text and "vllm_srun_queue_depth" in metrics.text
    spec = httpx.get(f"{minilm_server}/openapi.json").json()
    assert spec["openapi"].startswith("3.") and "/v1/embeddings" in spec["paths"]
    assert "EmbeddingsRequest" in spec["components"]["schemas"]
    r = httpx.post(f"{minilm_server}/v1/embeddings", json={"input": "timing"})
    timing = r.headers["server-timing"]
    for part in ("parse", "queue", "forward", "total"):
        assert re.search(rf"{part};dur=\d+\.\d+", timing), timing
    unknown = httpx.get(f"{minilm_server}/v1/nothing-here")
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "not_found"
