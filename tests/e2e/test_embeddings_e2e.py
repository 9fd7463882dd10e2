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
    assert max(b["meta"]["rows"] for b in bodies) == 1
    got = np.array([b["data"][0]["embedding"] for b in bodies])
    card = httpx.get(f"{minilm_server}/v1/models").json()["data"][0]
    if card["numerics"] != "exact":  # not batch-invariant here: the default profile, exact, runs rows alone
        assert card["profile"] == "exact" and forwards == len(texts)  # R-PROF-2
        assert np.array_equal(got, np.array(serial_vectors))  # bit for bit the answers each got alone
        return
    assert 1 <= forwards < len(texts), f"{forwards} forwards for {len(texts)} requests"
    assert any(b["meta"]["padded_tokens"] > 8 * 3 for b in bodies)  # some request rode a shared forward
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
        (b'{"input": "ok", "layer": 99}', 400, "invalid_request"),  # a layer the model does not declare
        (b'{"input": "ok", "options": {"max_tokens": 257}}', 400, "invalid_request"),  # over the model's limit
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


def test_one_over_long_input_fails_in_its_slot_and_the_openai_client_reads_the_rest(minilm_server: str) -> None:
    """R-API-10: the long input gets `max_length_exceeded` in its slot and takes no row; its
    siblings are answered; the openai client parses the answer (a failed item: embedding None)."""
    import openai

    from tests.contract_shapes import check

    texts = [SENTENCES[0], "word " * 400, SENTENCES[1]]
    raw = httpx.post(f"{minilm_server}/v1/embeddings", json={"input": texts, "options": {"return_meta": True}})
    assert raw.status_code == 200 and check("EmbeddingsResponse", raw.json()) == []
    first, failed, _ = raw.json()["data"]
    assert failed == {"object": "embedding", "index": 1, "error": "max_length_exceeded", "message": failed["message"]}
    assert "input[1] has 402 tokens, over the limit of 256" in failed["message"]
    assert first["input"] == {"tokens": 8, "processed_tokens": 8, "truncated": False}
    representation = raw.json()["meta"]["representation"]
    assert representation["layer"] == 6 and representation["dimension"] == 384 and representation["normalized"]
    assert representation["modality"] == "text" and len(representation["model_sha256"]) == 64
    rows = _metric(httpx.get(f"{minilm_server}/metrics").text, "vllm_srun_rows_total")
    client = openai.OpenAI(base_url=f"{minilm_server}/v1", api_key="unused")
    got = client.embeddings.create(model="all-MiniLM-L6-v2", input=["the new one", "word " * 400, "and another"])
    assert _metric(httpx.get(f"{minilm_server}/metrics").text, "vllm_srun_rows_total") - rows == 2
    assert got.data[1].embedding is None and got.data[1].error == "max_length_exceeded"
    assert len(got.data[0].embedding) == len(got.data[2].embedding) == 384
    assert got.data[0].input == {"tokens": 5, "processed_tokens": 5, "truncated": False}


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
    assert card["limits"]["max_input_tokens"] == 256 and len(card["model_sha256"]) == 64
    assert card["repo"] == "sentence-transformers/all-MiniLM-L6-v2" and card["embedding"]["dimensions"] == [384]
    assert models["api_version"] == "2.3.0" and models["limits"]["max_request_bytes"] == 200000
    health = httpx.get(f"{minilm_server}/health").json()
    assert health["status"] == "ready" and health["model"] == "all-MiniLM-L6-v2" and health["api_version"] == "2.3.0"
    assert httpx.get(f"{minilm_server}/health/live").json() == {"api_version": "2.3.0", "status": "alive"}
    assert httpx.get(f"{minilm_server}/openapi.yaml").text.startswith("openapi: 3.1.0")
    metrics = httpx.get(f"{minilm_server}/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    assert "vllm_srun_batch_rows_bucket" in metrics.text and "vllm_srun_queue_depth" in metrics.text
    spec = httpx.get(f"{minilm_server}/openapi.json").json()
    assert spec["openapi"].startswith("3.") and "/v1/embeddings" in spec["paths"]
    assert "EmbeddingsRequest" in spec["components"]["schemas"]
    r = httpx.post(f"{minilm_server}/v1/embeddings", json={"input": "timing"})
    timing = r.headers["server-timing"]
    for part in ("parse", "tokenize", "queue", "forward", "post", "serialize", "total"):
        assert re.search(rf"{part};dur=\d+\.\d+", timing), timing
    unknown = httpx.get(f"{minilm_server}/v1/nothing-here")
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "invalid_request"
