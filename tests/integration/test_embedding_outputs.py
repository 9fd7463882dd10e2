"""Outputs beyond one dense vector (issue 24), served in-process from our tiny fixtures and checked
against test-only references (transformers' models and tokenizers, sentence-transformers):
SPLADE sparse vectors, ColBERT multi-vectors, MaxSim rerank, quantized encodings, `/v2/embed`,
the card's output kinds, and the 400s for options a model or a kind does not take (no forward)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.integration.serving import serving
from tests.prometheus_text import metric

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
quantization = pytest.importorskip("sentence_transformers.util.quantization")

TOL = 1e-5
TEXTS = ["the cat sat on the mat", "paris is the capital of france", "x", "a quick brown fox jumps over the lazy dog"]
PROMPTS = {"search_query": "query: ", "document": "passage: ", "classification": "classify: "}


@pytest.fixture(scope="module")
def packages(encoder_fixture, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("outputs")
    ranged, prompted, bgem3 = root / "tiny-ranged", root / "tiny-prompted", root / "tiny-bgem3"
    for folder in (ranged, prompted, bgem3):
        shutil.copytree(encoder_fixture("embed"), folder)
        (folder / "golden.json").unlink()
    generator = torch.Generator().manual_seed(3)  # BGE-M3's layout: the ColBERT head in colbert_linear.pt
    head = {"weight": torch.randn(8, 32, generator=generator), "bias": torch.randn(8, generator=generator)}
    torch.save(head, bgem3 / "colbert_linear.pt")
    lows = np.linspace(-0.6, -0.1, 32).round(4).tolist()
    (ranged / "embedding_ranges.json").write_text(json.dumps({"min": lows, "max": [-x for x in lows]}))
    (prompted / "config_sentence_transformers.json").write_text(json.dumps({"prompts": PROMPTS}))
    return {
        "splade": encoder_fixture("splade"),
        "colbert": encoder_fixture("colbert"),
        "embed": encoder_fixture("embed"),
        "ranged": ranged,
        "prompted": prompted,
        "bgem3": bgem3,
    }


@pytest.fixture(scope="module")
def client(packages: dict[str, Path]):  # type: ignore[no-untyped-def]
    with serving(list(packages.values())) as (c, _runtime):
        yield c


def _post(client: Any, path: str, body: dict[str, Any], status: int = 200) -> dict[str, Any]:
    r = client.post(path, json=body)
    assert r.status_code == status, r.text
    return r.json()


def _forwards(client: Any) -> float:
    return metric(client.get("/metrics").text, "vllm_srun_forwards_total")


def _hf_tokens(folder: Path, text: str) -> dict[str, Any]:
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    return tok(text, return_tensors="pt", return_special_tokens_mask=True)


def _reference_sparse(folder: Path, text: str, keep_special: bool) -> dict[int, float]:
    """log(1 + ReLU(MLM logits)), max over the (non-special) tokens, with transformers' BertForMaskedLM."""
    model = transformers.BertForMaskedLM.from_pretrained(str(folder)).eval()
    enc = _hf_tokens(folder, text)
    special = enc.pop("special_tokens_mask")[0].bool()
    with torch.no_grad():
        logits = model(**enc).logits[0]
    keep = torch.ones_like(special) if keep_special else ~special
    pooled = torch.log1p(torch.relu(logits[keep])).amax(dim=0)
    return {int(i): float(pooled[i]) for i in torch.nonzero(pooled > 0).flatten()}


def _reference_tokens(folder: Path, text: str, colbert: bool) -> np.ndarray:
    model = transformers.BertModel.from_pretrained(str(folder)).eval()
    enc = _hf_tokens(folder, text)
    enc.pop("special_tokens_mask")
    with torch.no_grad():
        hidden = model(**enc).last_hidden_state[0, 1:]
    if colbert and (folder / "colbert_linear.pt").is_file():
        t = torch.load(str(folder / "colbert_linear.pt"), weights_only=True)
        hidden = hidden @ t["weight"].T + t["bias"]
    elif colbert:
        from safetensors.torch import load_file

        t = load_file(str(folder / "model.safetensors"))
        hidden = hidden @ t["colbert_linear.weight"].T + t["colbert_linear.bias"]
    return torch.nn.functional.normalize(hidden, dim=-1).numpy()


def _as_dict(sparse: dict[str, Any]) -> dict[int, float]:
    assert sparse["indices"] == sorted(sparse["indices"])
    return dict(zip(sparse["indices"], sparse["values"]))


def _close(ours: dict[int, float], ref: dict[int, float]) -> None:
    assert ours.keys() == ref.keys()
    assert max(abs(ours[k] - ref[k]) for k in ref) <= TOL


@pytest.mark.parametrize("keep_special", [False, True])
def test_sparse_equals_the_reference_math(client: Any, packages: dict[str, Path], keep_special: bool) -> None:
    options = {} if keep_special else {"special_tokens": "exclude"}  # the default keeps them
    body = _post(
        client,
        "/v1/embeddings",
        {"model": "tiny-splade", "input": TEXTS, "embedding_type": "sparse", "options": options},
    )
    for text, item in zip(TEXTS, body["data"]):
        _close(_as_dict(item["embedding"]), _reference_sparse(packages["splade"], text, keep_special))


def test_sparse_top_k_and_threshold_cut_the_full_vector(client: Any) -> None:
    full = _as_dict(
        _post(client, "/v1/embeddings", {"model": "tiny-splade", "input": TEXTS[1], "embedding_type": "sparse"})[
            "data"
        ][0]["embedding"]
    )
    cut = _post(
        client,
        "/v1/embeddings",
        {
            "model": "tiny-splade",
            "input": TEXTS[1],
            "embedding_type": "sparse",
            "options": {"top_k": 4, "threshold": 0.5},
        },
    )["data"][0]["embedding"]
    expected = sorted(sorted(((v, -k) for k, v in full.items() if v > 0.5), reverse=True)[:4], key=lambda p: -p[1])
    assert cut["indices"] == [-k for _, k in expected]
    assert cut["values"] == pytest.approx([v for v, _ in expected], abs=0)


def test_sparse_equals_sentence_transformers_sparse_encoder(client: Any, packages: dict[str, Path]) -> None:
    """With no option, as the package's own library answers (issue 45: a default of ours never
    differs from it without saying so)."""
    st = pytest.importorskip("sentence_transformers")
    theirs = st.SparseEncoder(str(packages["splade"]), device="cpu").encode(TEXTS, convert_to_tensor=True).to_dense()
    body = _post(client, "/v1/embeddings", {"model": "tiny-splade", "input": TEXTS, "embedding_type": "sparse"})
    for row, item in zip(theirs, body["data"]):
        ref = {int(i): float(row[i]) for i in torch.nonzero(row > 0).flatten()}
        _close(_as_dict(item["embedding"]), ref)


@pytest.mark.parametrize(("model", "colbert"), [("tiny-colbert", True), ("tiny-embed", False), ("tiny-bgem3", True)])
def test_multi_vector_equals_the_reference(client: Any, packages: dict[str, Path], model: str, colbert: bool) -> None:
    body = _post(client, "/v1/embeddings", {"model": model, "input": TEXTS, "embedding_type": "multi_vector"})
    for text, item in zip(TEXTS, body["data"]):
        ours = np.array(item["embedding"])
        ref = _reference_tokens(packages[model.removeprefix("tiny-")], text, colbert)
        assert ours.shape == ref.shape
        assert np.abs(ours - ref).max() <= TOL
        assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


def test_rerank_of_a_colbert_package_scores_by_maxsim(client: Any, packages: dict[str, Path]) -> None:
    docs = ["paris is the capital of france", "the river flows to the sea", "a small cat"]
    body = _post(client, "/v1/rerank", {"model": "tiny-colbert", "query": "capital of france", "documents": docs})
    query = _reference_tokens(packages["colbert"], "capital of france", True)
    expected = [float((query @ _reference_tokens(packages["colbert"], d, True).T).max(axis=1).sum()) for d in docs]
    got = {r["index"]: r["relevance_score"] for r in body["results"]}
    assert [r["index"] for r in body["results"]] == sorted(range(3), key=lambda i: -expected[i])
    assert max(abs(got[i] - expected[i]) for i in range(3)) <= 1e-4
    card = next(m for m in client.get("/v1/models").json()["data"] if m["id"] == "tiny-colbert")
    assert card["rerank"]["relevance"].startswith("maxsim")


def test_the_card_says_which_outputs_a_model_has(client: Any) -> None:
    cards = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    assert cards["tiny-splade"]["embedding"]["outputs"] == ["sparse", "multi_vector"]
    assert cards["tiny-colbert"]["embedding"]["outputs"] == ["dense", "multi_vector"]
    assert cards["tiny-colbert"]["embedding"]["multi_vector"]["head"] == "colbert_linear"
    assert cards["tiny-embed"]["embedding"]["outputs"] == ["dense", "multi_vector"]
    assert cards["tiny-ranged"]["embedding"]["encodings"]["int8_ranges"].startswith("package")
    for name in ("tiny-splade", "tiny-colbert"):
        assert cards[name]["golden"]["status"] == "matched", cards[name]["golden"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"model": "tiny-splade", "input": "x"}, "embedding_type"),
        ({"model": "tiny-colbert", "input": "x", "embedding_type": "sparse"}, "embedding_type"),
        ({"model": "tiny-colbert", "input": "x", "options": {"top_k": 3}}, "options.top_k"),
        ({"model": "tiny-colbert", "input": "x", "options": {"threshold": 0.1}}, "options.threshold"),
        (
            {"model": "tiny-splade", "input": "x", "embedding_type": "sparse", "encoding_format": "int8"},
            "encoding_format",
        ),
        ({"model": "tiny-splade", "input": "x", "embedding_type": "sparse", "dimensions": 4}, "dimensions"),
        ({"model": "tiny-splade", "input": "x", "embedding_type": "sparse", "options": {"top_k": 0}}, "top_k"),
        ({"model": "tiny-colbert", "input": "x", "encoding_format": "int4"}, "encoding_format"),
        (
            {
                "model": "tiny-colbert",
                "query": "q",
                "documents": ["d"],
                "options": {"overflow": "window", "window": {"tokens": 8}},
            },
            "options.overflow",
        ),
    ],
)
def test_bad_output_options_answer_400_naming_the_field_and_cost_no_forward(
    client: Any, body: dict[str, Any], field: str
) -> None:
    path = "/v1/rerank" if "query" in body else "/v1/embeddings"
    before = _forwards(client)
    error = _post(client, path, body, 400)["error"]
    assert field in error["message"] and "\n" not in error["message"]
    assert _forwards(client) == before


@pytest.mark.parametrize("model", ["tiny-colbert", "tiny-ranged"])
@pytest.mark.parametrize("precision", ["int8", "uint8", "binary", "ubinary"])
def test_quantized_encodings_equal_sentence_transformers(client: Any, model: str, precision: str) -> None:
    floats = np.array(
        [d["embedding"] for d in _post(client, "/v1/embeddings", {"model": model, "input": TEXTS})["data"]],
        dtype=np.float32,
    )
    body = _post(client, "/v1/embeddings", {"model": model, "input": TEXTS, "encoding_format": precision})
    q = body["quantization"]
    ranges = np.array(q["ranges"]) if q.get("ranges") is not None else None
    assert (ranges is not None) == (precision in ("int8", "uint8"))
    if ranges is not None:
        assert q["ranges_from"] == ("package" if model == "tiny-ranged" else "fixed")
    theirs = quantization.quantize_embeddings(floats, precision, ranges=ranges)
    ours = np.array([d["embedding"] for d in body["data"]], dtype=theirs.dtype)
    assert ours.tobytes() == theirs.tobytes()
    packed = _post(
        client, "/v1/embeddings", {"model": model, "input": TEXTS, "encoding_format": precision, "base64": True}
    )
    import base64

    raw = b"".join(base64.b64decode(d["embedding"]) for d in packed["data"])
    assert raw == theirs.tobytes()


def test_cohere_embed_by_type_equals_v1(client: Any) -> None:
    types = ["float", "int8", "uint8", "binary", "ubinary", "base64"]
    body = _post(
        client,
        "/v2/embed",
        {"model": "tiny-prompted", "texts": TEXTS, "input_type": "search_query", "embedding_types": types},
    )
    assert body["response_type"] == "embeddings_by_type" and body["texts"] == TEXTS
    v1 = _post(client, "/v1/embeddings", {"model": "tiny-prompted", "input": TEXTS, "prompt_name": "search_query"})
    floats = np.array([d["embedding"] for d in v1["data"]], dtype=np.float32)
    assert np.array_equal(np.array(body["embeddings"]["float"], dtype=np.float32), floats)
    assert body["meta"]["billed_units"]["input_tokens"] == v1["usage"]["prompt_tokens"]
    fixed = np.array([[-1.0] * 32, [1.0] * 32])
    for t in ("int8", "uint8", "binary", "ubinary"):
        theirs = quantization.quantize_embeddings(floats, t, ranges=fixed)
        assert np.array(body["embeddings"][t], dtype=theirs.dtype).tobytes() == theirs.tobytes()
    plain = _post(client, "/v2/embed", {"model": "tiny-prompted", "texts": TEXTS, "input_type": "clustering"})
    unprompted = _post(client, "/v1/embeddings", {"model": "tiny-prompted", "input": TEXTS})
    assert np.array_equal(
        np.array(plain["embeddings"]["float"]), np.array([d["embedding"] for d in unprompted["data"]])
    )


def test_cohere_truncate_cuts_the_end_or_the_start(client: Any) -> None:
    long = " ".join(["cat"] * 60 + ["dog"] * 100)
    end = _post(client, "/v2/embed", {"model": "tiny-embed", "texts": [long], "input_type": "search_document"})
    start = _post(
        client,
        "/v2/embed",
        {"model": "tiny-embed", "texts": [long], "input_type": "search_document", "truncate": "START"},
    )
    cats = _post(client, "/v1/embeddings", {"model": "tiny-embed", "input": " ".join(["cat"] * 60 + ["dog"] * 66)})
    dogs = _post(client, "/v1/embeddings", {"model": "tiny-embed", "input": " ".join(["cat"] * 26 + ["dog"] * 100)})
    assert np.allclose(end["embeddings"]["float"][0], cats["data"][0]["embedding"], atol=1e-6)
    assert np.allclose(start["embeddings"]["float"][0], dogs["data"][0]["embedding"], atol=1e-6)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"texts": [" ".join(["cat"] * 300)], "truncate": "NONE"}, "truncate"),
        ({"texts": ["x"], "output_dimension": 999}, "output_dimension"),
        ({"texts": ["x"], "images": ["data:image/png;base64,AAAA"]}, "images"),
        ({"texts": ["x"], "input_type": "image"}, "input_type"),
        ({"texts": ["x"], "embedding_types": ["int4"]}, "embedding_types"),
        ({"input_type": "search_query"}, "texts"),
    ],
)
def test_bad_cohere_fields_answer_400_naming_them(client: Any, body: dict[str, Any], field: str) -> None:
    before = _forwards(client)
    error = _post(client, "/v2/embed", {"model": "tiny-embed", **body}, 400)["error"]
    assert field in error["message"]
    assert _forwards(client) == before
