"""`/v1/embeddings` with `input_type` and `prompt_name` (and `/v1/bundle`, which prepares the same
way), served in-process from tiny sentence-transformers packages: the prompt chosen as
sentence-transformers chooses it, its tokens in `usage`, a Dense module's width in the answer and
on the card, and the 400s for a prompt the package does not have."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.integration.serving import serving
from tests.integration.test_sentence_transformers_packages import HIDDEN, TANH, build, theirs
from vllm_srun.adapters.families.fixtures.encoder_fixture import POSITIONS, WORDS, write_encoder_fixture
from vllm_srun.adapters.families.fixtures.wordpiece_fixture import write_tiny_wordpiece_tokenizer
from vllm_srun.adapters.models.st_modules import read_text_settings
from vllm_srun.adapters.models.tokenization import TextTokenizer

pytest.importorskip("sentence_transformers")

TOL = 1e-5
TEXTS = ["The Cat sat on the MAT", "Paris is the capital of France", "x"]
E5 = {"query": "query: ", "passage": "passage: "}  # e5-style names, no default
QWEN = {"query": "Instruct: find the answer\nQuery: ", "document": ""}  # Qwen3-Embedding-style, default query


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("prompt-packages")
    folders = {
        "e5-dense": build(
            root / "e5-dense",
            {"pooling_mode": "mean"},
            [("Dense", HIDDEN, 16, TANH, True), ("Normalize",)],
            st_config={"prompts": E5, "default_prompt_name": None, "similarity_fn_name": "dot"},
            bert_config={"do_lower_case": True},
        ),
        "qwen-style": build(
            root / "qwen-style",
            {"pooling_mode": "lasttoken"},
            [("Normalize",)],
            new_names=True,
            st_config={"prompts": QWEN, "default_prompt_name": "query"},
            seed=1,
        ),
        "plain": root / "plain",
    }
    write_encoder_fixture(folders["plain"], "embed", 2)
    # a cased tokenizer (same ids): the package's do_lower_case must lowercase the texts first
    write_tiny_wordpiece_tokenizer(folders["e5-dense"], WORDS, lowercase=False, model_max_length=POSITIONS)
    with serving(list(folders.values())) as (client, _runtime):
        yield client, folders


def _embed(client: Any, model: str, **fields: Any) -> tuple[np.ndarray, int]:
    r = client.post("/v1/embeddings", json={"model": model, "input": TEXTS, **fields})
    assert r.status_code == 200, r.text
    body = r.json()
    return np.array([d["embedding"] for d in body["data"]]), body["usage"]["prompt_tokens"]


def _tokens(folder: Path, prompt: str) -> int:
    texts = read_text_settings(folder).fold_case([prompt + t for t in TEXTS])
    return sum(len(e.ids) for e in TextTokenizer.from_folder(folder).encode(texts))


@pytest.mark.parametrize(
    ("fields", "st_prompt_name", "prompt"),
    [
        ({}, None, ""),
        ({"input_type": "query"}, "query", "query: "),
        ({"input_type": "document"}, "passage", "passage: "),  # no "document" prompt: "passage" is the document one
        ({"prompt_name": "passage"}, "passage", "passage: "),
        ({"input_type": "query", "prompt_name": "query"}, "query", "query: "),
    ],
)
def test_prompt_fields_match_sentence_transformers(
    served, fields: dict, st_prompt_name: str | None, prompt: str
) -> None:  # type: ignore[no-untyped-def]
    client, folders = served
    got, tokens = _embed(client, "e5-dense", **fields)
    want = theirs(folders["e5-dense"], TEXTS, prompt_name=st_prompt_name)
    assert got.shape == want.shape == (len(TEXTS), 16)  # the Dense module's width
    assert np.abs(got - want).max() <= TOL
    assert tokens == _tokens(folders["e5-dense"], prompt)  # the prompt's tokens are counted
    if prompt:
        assert np.abs(got - theirs(folders["e5-dense"], TEXTS)).max() > 1e-3


def test_default_prompt_name_applies_without_the_fields(served) -> None:  # type: ignore[no-untyped-def]
    client, folders = served
    folder = folders["qwen-style"]
    plain, tokens = _embed(client, "qwen-style")
    assert np.abs(plain - theirs(folder, TEXTS)).max() <= TOL  # sentence-transformers applies the default too
    assert tokens == _tokens(folder, QWEN["query"])
    query, _ = _embed(client, "qwen-style", input_type="query")
    assert np.array_equal(query, plain)
    document, tokens = _embed(client, "qwen-style", input_type="document")
    assert np.abs(document - theirs(folder, TEXTS, prompt_name="document")).max() <= TOL
    assert tokens == _tokens(folder, "") and np.abs(document - plain).max() > 1e-3


@pytest.mark.parametrize(
    ("model", "fields", "message"),
    [
        (
            "e5-dense",
            {"prompt_name": "nope"},
            "prompt_name 'nope' is not a prompt of this model (this model's prompts: query, passage)",
        ),
        ("plain", {"input_type": "query"}, "input_type 'query' needs a model with prompts (this model has no prompts)"),
        (
            "plain",
            {"prompt_name": "query"},
            "prompt_name 'query' is not a prompt of this model (this model has no prompts)",
        ),
        (
            "e5-dense",
            {"input_type": "document", "prompt_name": "query"},
            "input_type 'document' selects prompt 'passage' but prompt_name is 'query' (this model's prompts: query, passage)",
        ),
        (
            "qwen-style",
            {"input_type": "query", "prompt_name": "document"},
            "selects prompt 'query' but prompt_name is 'document'",
        ),
    ],
)
def test_a_prompt_the_package_does_not_have_answers_400(served, model: str, fields: dict, message: str) -> None:  # type: ignore[no-untyped-def]
    client, _ = served
    r = client.post("/v1/embeddings", json={"model": model, "input": TEXTS, **fields})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request"
    assert message in r.json()["error"]["message"]


def test_input_type_is_query_or_document(served) -> None:  # type: ignore[no-untyped-def]
    client, _ = served
    r = client.post("/v1/embeddings", json={"model": "e5-dense", "input": "x", "input_type": "passage"})
    assert r.status_code == 400 and "input_type" in r.json()["error"]["message"]


def test_card_lists_prompts_and_the_width_after_dense(served) -> None:  # type: ignore[no-untyped-def]
    client, _ = served
    cards = {c["id"]: c for c in client.get("/v1/models").json()["data"]}
    e5, qwen, plain = (cards[name]["embedding"] for name in ("e5-dense", "qwen-style", "plain"))
    assert e5["dimensions"] == [16] and e5["normalized"] is True and e5["pooling"] == "mean"
    assert e5["prompts"] == E5 and e5["default_prompt_name"] is None and e5["similarity_fn_name"] == "dot"
    assert e5["after_pooling"] == ["Dense(2_Dense: 32→16, Tanh)", "Normalize"]
    assert qwen["prompts"] == QWEN and qwen["default_prompt_name"] == "query" and qwen["pooling"] == "lasttoken"
    assert plain["prompts"] == {} and plain["default_prompt_name"] is None and plain["dimensions"] == [HIDDEN]


def test_bundle_tasks_take_the_same_fields(served) -> None:  # type: ignore[no-untyped-def]
    client, _ = served
    alone, _ = _embed(client, "e5-dense", input_type="query")
    tasks = [
        {"id": "q", "embeddings": {"model": "e5-dense", "input": TEXTS, "input_type": "query"}},
        {"id": "bad", "embeddings": {"model": "e5-dense", "input": TEXTS, "prompt_name": "nope"}},
    ]
    r = client.post("/v1/bundle", json={"tasks": tasks})
    assert r.status_code == 200, r.text
    first, bad = r.json()["results"]
    assert np.array_equal(np.array([d["embedding"] for d in first["embeddings"]["data"]]), alone)
    assert bad["status"] == 400 and "prompt_name 'nope'" in bad["error"]["message"]
