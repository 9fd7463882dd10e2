"""The upstream contract's shapes (`tests/contract_shapes.py`) catch what they describe: missing
required fields, wrong JSON types, values outside an enum, nulls where none is allowed, and the
same inside nested objects, lists and maps; extra fields pass."""

from __future__ import annotations

import pytest

from tests.contract_shapes import KINDS, SHAPES, check

GOOD_CARD = {
    "id": "m",
    "object": "model",
    "family": "encoder",
    "surfaces": ["classify"],
    "ready": True,
    "model_sha256": "ab" * 32,
    "heads": [{"name": "classify", "kind": "sequence", "labels": ["a", "b"], "window": None, "reduction": "max"}],
    "embedding": {
        "dimensions": [8],
        "layers": [2],
        "modalities": ["text"],
        "normalized": True,
        "pooling": "mean",
        "input_types": [],
    },
    "golden": {"status": "matched", "checked": 2, "matched": 2, "reference": "cpu/float32"},
    "kernels": {"ours": "an extension"},
}


def test_a_conforming_answer_has_no_problems() -> None:
    body = {
        "object": "list",
        "api_version": "2.3.0",
        "data": [GOOD_CARD],
        "limits": {"max_bundle_tasks": 64, "max_request_bytes": 1},
    }
    assert check("ModelList", body) == []
    assert check("Liveness", {"api_version": "2.3.0", "status": "alive"}) == []


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"ready": "yes"}, "$.ready: expected bool, got str"),
        ({"surfaces": "classify"}, "$.surfaces: expected a list, got str"),
        ({"model_sha256": None}, "$.model_sha256: expected str, got null"),
        ({"repo": None}, None),  # nullable
        ({"status": "sleeping"}, "$.status: 'sleeping' is not one of"),
        ({"golden": {"status": "matched", "reference": {"device": "cpu"}}}, "$.golden.reference: expected str"),
        ({"heads": [{"name": "h", "kind": "multi", "labels": []}]}, "$.heads[0].kind: 'multi' is not one of"),
        ({"embedding": {**GOOD_CARD["embedding"], "dimensions": 8}}, "$.embedding.dimensions: expected a list"),
        (
            {"embedding": {k: v for k, v in GOOD_CARD["embedding"].items() if k != "layers"}},
            "$.embedding.layers: required",
        ),
        ({"parameters": 1.5}, "$.parameters: expected int, got num"),
        ({"parameters": True}, "$.parameters: expected int, got bool"),
    ],
)
def test_each_departure_is_named_with_its_path(change: dict, problem: str | None) -> None:
    found = check("ModelCard", {**GOOD_CARD, **change})
    if problem is None:
        assert found == []
    else:
        assert len(found) == 1 and found[0].startswith(problem), found


def test_required_fields_and_item_errors() -> None:
    assert check("Health", {"status": "ready"}) == ["$.api_version: required, missing"]
    result = {"index": 0, "error": "too_long"}
    body = {"model": "m", "head": "h", "kind": "sequence", "labels": [], "results": [result], "usage": {}}
    assert check("ClassifyResponse", body) == [
        "$.results[0].error: 'too_long' is not one of ['invalid_question', 'invalid_input', 'max_length_exceeded', "
        "'scan_budget_exceeded', 'invalid_model_output', 'deadline_exceeded', 'unavailable']",
        "$.usage.input_tokens: required, missing",
        "$.usage.output_tokens: required, missing",
    ]
    assert check("ErrorResponse", {"error": {"code": "not_found", "message": "x"}})[0].startswith("$.error.code")


def test_a_vector_is_floats_or_base64() -> None:
    item = {"object": "embedding", "index": 0}
    body = {"object": "list", "model": "m", "usage": {"prompt_tokens": 1, "total_tokens": 1}, "data": [item]}
    assert check("EmbeddingsResponse", {**body, "data": [{**item, "embedding": [0.5, 1]}]}) == []
    assert check("EmbeddingsResponse", {**body, "data": [{**item, "embedding": "AAAA"}]}) == []
    assert check("EmbeddingsResponse", {**body, "data": [{**item, "embedding": {"indices": []}}]})


def test_every_kind_is_described_and_an_unknown_one_is_refused() -> None:
    assert set(KINDS) <= set(SHAPES)
    with pytest.raises(KeyError):
        check("Nothing", {})
