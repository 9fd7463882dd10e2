"""Embeddings with the official openai client against `vllm-srun serve` (default model).

pip install -e '.[clients]'      # the openai client (not a dependency of the server)
python docs/examples/embeddings_openai.py [BASE_URL]
"""

import sys

import openai

base = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8100"
client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused")
result = client.embeddings.create(
    model="all-MiniLM-L6-v2",
    input=["A man is eating food.", "A man is eating a piece of bread."],
)
a, b = (d.embedding for d in result.data)
print(f"{len(a)} dimensions, cosine {sum(x * y for x, y in zip(a, b)):.3f}")
