"""One user-visible promise through a real `vllm-srun serve` process: a token-classification
package answers `/v1/classify` with `kind: token` spans (code-point offsets, `text` = the input's
slice), its card says so, and its golden check matched."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.server import running_server

pytestmark = pytest.mark.slow


def test_token_head_serves_spans(encoder_fixture) -> None:  # type: ignore[no-untyped-def]
    text = "María lives in São Paulo, near paris"
    with running_server(str(encoder_fixture("token"))) as base:
        r = httpx.post(f"{base}/v1/classify", json={"input": [text], "options": {"aggregation": "first"}}, timeout=30)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["kind"] == "token" and body["labels"][0] == "O"
        spans = body["results"][0]["spans"]
        assert spans and all(s["text"] == text[s["start"] : s["end"]] for s in spans)
        assert all(s["label"] in {"PER", "LOC"} and 0 < s["probability"] <= 1 for s in spans)
        bad = httpx.post(f"{base}/v1/classify", json={"input": "x", "options": {"aggregation": "avg"}}, timeout=30)
        assert bad.status_code == 400 and "options.aggregation" in bad.json()["error"]["message"]
        (card,) = httpx.get(f"{base}/v1/models", timeout=30).json()["data"]
        assert card["heads"][0]["kind"] == "token" and card["golden"]["status"] == "matched"
