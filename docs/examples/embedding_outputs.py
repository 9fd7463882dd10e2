"""Sparse, multi-vector and quantized embeddings, MaxSim rerank and Cohere's embed, against a server.

    pip install -e '.[clients]'      # the cohere client (not a dependency of the server)
    python docs/examples/embedding_outputs.py http://127.0.0.1:8100 SPARSE_MODEL COLBERT_MODEL

SPARSE_MODEL is a SPLADE package (sentence-transformers SparseEncoder), COLBERT_MODEL one with a
`colbert_linear` head (e.g. `vllm-srun fixture OUT --family encoder --variant splade` / `colbert`).
"""

import sys

import cohere
import httpx
import numpy as np

base, sparse_model, colbert_model = sys.argv[1:4]
http = httpx.Client(base_url=base, timeout=60)


def post(path: str, body: dict) -> dict:
    """The answer's body; a refusal stops the example with the server's one-line error."""
    r = http.post(path, json=body)
    if r.status_code != 200:
        sys.exit(f"{path}: {r.status_code} {r.text}")
    return r.json()


# 1. sparse (SPLADE): {indices, values} over the vocabulary, the 5 largest weights
got = post(
    "/v1/embeddings",
    {
        "model": sparse_model,
        "input": "paris is the capital of france",
        "embedding_type": "sparse",
        "options": {"top_k": 5},
    },
)
sparse = got["data"][0]["embedding"]
print(f"sparse: {len(sparse['indices'])} terms, largest weight {max(sparse['values']):.3f}")

# 2. multi-vector (ColBERT): one normalised vector per token after the first
got = post("/v1/embeddings", {"model": colbert_model, "input": "capital of france", "embedding_type": "multi_vector"})
tokens = np.array(got["data"][0]["embedding"])
print(f"multi_vector: {tokens.shape[0]} vectors of {tokens.shape[1]}")

# 3. rerank by MaxSim (automatic for a package with a ColBERT head and no classifier)
ranked = post(
    "/v1/rerank",
    {"model": colbert_model, "query": "capital of france", "documents": ["a small cat", "paris is in france"]},
)
print("rerank order:", [x["index"] for x in ranked["results"]])

# 4. int8 (sentence-transformers' quantize_embeddings); the ranges used come back in `quantization`
body = post("/v1/embeddings", {"model": colbert_model, "input": ["a small cat"], "encoding_format": "int8"})
print(f"int8: {len(body['data'][0]['embedding'])} values, ranges from {body['quantization']['ranges_from']}")

# 5. the official cohere client, unmodified: several embedding types at once
co = cohere.ClientV2(base_url=base, api_key="unused")
got = co.embed(
    model=colbert_model, texts=["a small cat"], input_type="search_query", embedding_types=["float", "ubinary"]
)
print(f"cohere: float {len(got.embeddings.float_[0])}, ubinary {len(got.embeddings.ubinary[0])} bytes")
