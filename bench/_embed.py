"""Fetch the embeddings a server answers, as float32 arrays (base64 bodies: the exact bits)."""

from __future__ import annotations

import base64
import json
import urllib.request

import numpy as np


def embeddings(base: str, texts: list[str], per_request: int = 16) -> np.ndarray:
    """[len(texts), D] float32, in order, a few texts per request."""
    out = []
    for i in range(0, len(texts), per_request):
        body = json.dumps({"input": texts[i : i + per_request], "encoding_format": "base64"}).encode()
        request = urllib.request.Request(f"{base}/v1/embeddings", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=300) as r:
            data = json.load(r)["data"]
        out.extend(np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in data)
    return np.stack(out)


def card(base: str) -> dict:
    with urllib.request.urlopen(f"{base}/v1/models", timeout=30) as r:
        return json.load(r)["data"][0]
