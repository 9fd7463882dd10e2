"""Token heads on /v1/classify (`kind: token`): labelled spans, per-token labels, long inputs in windows.

vllm-srun fixture /tmp/tiny-token --family encoder --variant token
vllm-srun serve /tmp/tiny-token &
until curl -sf localhost:8100/health > /dev/null; do sleep 1; done
python docs/examples/token_classify.py http://127.0.0.1:8100 tiny-token
"""

import sys

import httpx

base, model = sys.argv[1:3]
http = httpx.Client(base_url=base, timeout=60)
text = "María moved from São Paulo to paris"

# 1. spans, aggregated as transformers' pipeline("token-classification", aggregation_strategy="simple")
r = http.post("/v1/classify", json={"model": model, "input": text})
r.raise_for_status()
for span in r.json()["results"][0]["spans"]:  # code-point offsets, end exclusive
    assert span["text"] == text[span["start"] : span["end"]]
    print(f"{span['label']:>4} {span['start']:>3}-{span['end']:<3} {span['text']!r} p={span['probability']:.3f}")

# 2. word-level labels (`first`) and every token's own label
r = http.post(
    "/v1/classify", json={"model": model, "input": text, "options": {"aggregation": "first", "return_tokens": True}}
)
r.raise_for_status()
result = r.json()["results"][0]
print("first:", [(s["label"], s["text"]) for s in result["spans"]])
print("tokens:", [(t["token"], t["label"]) for t in result["tokens"]])
print("probabilities of the first token:", result["tokens"][0]["probabilities"])  # one per label, labels' order

# 3. a long input read in overlapping windows: a span seen in two windows is answered once
long_text = " ".join([text] * 20)
options = {"overflow": "window", "window": {"tokens": 32, "overlap": 8}}
r = http.post("/v1/classify", json={"model": model, "input": long_text, "options": options})
r.raise_for_status()
result = r.json()["results"][0]
print(f"{result['input']['windows']} windows, {len(result['spans'])} spans after the union")
for window in result["windows"]:  # content-token offsets (the contract's), characters (ours)
    print(f"  tokens {window['start']}-{window['end']} chars {window['char_start']}-{window['char_end']}")

# 4. a bad option is a 400 that names the field; an input the head cannot read fails in its slot
r = http.post("/v1/classify", json={"model": model, "input": text, "options": {"aggregation": "max"}})
print(r.status_code, r.json()["error"]["message"])
r = http.post("/v1/classify", json={"model": model, "input": [text, {"text": "a", "text_pair": "b"}]})
print(r.status_code, [res.get("error", "answered") for res in r.json()["results"]])
