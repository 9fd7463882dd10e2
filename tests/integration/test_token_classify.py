"""Token heads on `/v1/classify` (issue 24): a tiny BertForTokenClassification fixture served
in-process, its spans checked against transformers' token-classification pipeline (test-only
reference, its own tokenizer) for `simple`, `first` and `none`; windows whose spans merge once;
`options.threshold` as the span threshold; the contract's per-token probabilities; the 400s for
options a head does not take and the inputs that fail in their slot (R-API-10); the card's
`heads` entry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.contract_shapes import check
from tests.integration.serving import serving

transformers = pytest.importorskip("transformers")

TOL = 1e-5
TEXTS = [
    "paris is the capital of france",
    "Jean-Pierre met María in São Paulo, today!",  # punctuation, accents, an unknown word piece
    "the quick brown fox jumps over the lazy dog",
    "so, refund my order: it's boring... (not great)",
    "naïve café — 東京 tomorrow",  # non-ASCII: CJK characters are words of their own
]


@pytest.fixture(scope="module")
def folders(encoder_fixture) -> dict[str, Path]:  # type: ignore[no-untyped-def]
    return {"token": encoder_fixture("token"), "classify": encoder_fixture("classify")}


@pytest.fixture(scope="module")
def client(folders: dict[str, Path]):  # type: ignore[no-untyped-def]
    with serving(list(folders.values())) as (c, _runtime):
        yield c


def _post(client: Any, body: dict[str, Any], status: int = 200) -> dict[str, Any]:
    r = client.post("/v1/classify", json={"model": "tiny-token", **body})
    assert r.status_code == status, r.text
    if status == 200:
        assert check("ClassifyResponse", r.json()) == []
    return r.json()


def _pipeline(folder: Path, how: str) -> Any:
    model = transformers.AutoModelForTokenClassification.from_pretrained(str(folder)).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    return transformers.pipeline("token-classification", model=model, tokenizer=tokenizer, aggregation_strategy=how)


@pytest.mark.parametrize("how", ["simple", "first", "none"])
def test_spans_match_the_transformers_pipeline(client, folders, how: str) -> None:  # type: ignore[no-untyped-def]
    reference = _pipeline(folders["token"], how)
    options = {} if how == "simple" else {"options": {"aggregation": how}}  # simple is the default
    got = _post(client, {"input": TEXTS, **options})
    assert got["kind"] == "token" and got["labels"] == ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    assert got["head"] == "classify"
    seen = 0
    for text, result in zip(TEXTS, got["results"]):
        expected = reference(text)
        assert len(result["spans"]) == len(expected), (text, result["spans"], expected)
        for span, ref in zip(result["spans"], expected):
            label = ref["entity"] if how == "none" else ref["entity_group"]
            assert (span["label"], span["start"], span["end"]) == (label, ref["start"], ref["end"]), text
            assert span["text"] == text[span["start"] : span["end"]]
            assert abs(span["probability"] - float(ref["score"])) <= TOL
        seen += len(expected)
    assert seen >= 5  # the fixture's labels vary: there is something to compare


def test_first_differs_from_simple_where_a_word_has_pieces(client) -> None:  # type: ignore[no-untyped-def]
    """`first` gives every piece of a word its first piece's label: no span starts inside a word."""
    text = "refundable bankaccounts tomorrow"
    first = _post(client, {"input": text, "options": {"aggregation": "first", "return_tokens": True}})["results"][0]
    starts = {t["start"] for t in first["tokens"] if text[t["start"] - 1 : t["start"]] in ("", " ")}
    assert all(s["start"] in starts for s in first["spans"])
    assert all(s["end"] == len(text) or text[s["end"]] == " " for s in first["spans"])


def test_return_tokens_lists_every_token_with_its_label(client) -> None:  # type: ignore[no-untyped-def]
    result = _post(client, {"input": TEXTS[0], "options": {"return_tokens": True}})["results"][0]
    assert [t["token"] for t in result["tokens"]] == ["paris", "is", "the", "capital", "of", "france"]
    labels = {t["label"] for t in result["tokens"]}
    assert labels <= {"O", "B-PER", "I-PER", "B-LOC", "I-LOC"}
    assert all(0 < t["probability"] <= 1 for t in result["tokens"])
    for t in result["tokens"]:  # the contract's per-label probabilities; ours: the most probable label
        assert len(t["probabilities"]) == 5 and abs(sum(t["probabilities"]) - 1) < 1e-6
        assert t["probability"] == max(t["probabilities"]) and t["label"] == labels_of(t)
    assert "tokens" not in _post(client, {"input": TEXTS[0]})["results"][0]


def labels_of(token: dict[str, Any]) -> str:
    return ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"][token["probabilities"].index(max(token["probabilities"]))]


def test_threshold_keeps_the_spans_at_or_above_it(client) -> None:  # type: ignore[no-untyped-def]
    every = _post(client, {"input": TEXTS})["results"]
    probabilities = sorted(s["probability"] for r in every for s in r["spans"])
    middle = probabilities[len(probabilities) // 2]
    kept = _post(client, {"input": TEXTS, "options": {"threshold": middle}})["results"]
    for full, cut in zip(every, kept):
        assert cut["spans"] == [s for s in full["spans"] if s["probability"] >= middle]
    assert 0 < sum(len(r["spans"]) for r in kept) < len(probabilities)


def test_windows_merge_spans_seen_twice_into_one_with_the_highest_probability(client) -> None:  # type: ignore[no-untyped-def]
    text = " ".join(TEXTS[:4]) * 3
    body = {"input": text, "options": {"overflow": "window", "window": {"tokens": 16, "overlap": 6}}}
    result = _post(client, body)["results"][0]
    windows = result["windows"]
    assert len(windows) > 3 and result["input"]["windows"] == len(windows)
    step = 16 - 2 - 6  # content tokens between window starts
    assert [w["start"] for w in windows] == [k * step for k in range(len(windows))]
    assert result["input"]["tokens"] == windows[-1]["end"] + 2 == result["input"]["processed_tokens"]
    merged = result["spans"]
    keys = [(s["label"], s["start"], s["end"]) for s in merged]
    assert len(keys) == len(set(keys)) and keys == sorted(keys, key=lambda k: (k[1], k[2], k[0]))
    shared = 0
    for span in merged:
        inside = [
            s
            for w in windows
            for s in w["spans"]
            if s["label"] == span["label"] and span["start"] <= s["start"] and s["end"] <= span["end"]
        ]
        assert inside, span
        assert span["probability"] == max(s["probability"] for s in inside)
        assert span["text"] == text[span["start"] : span["end"]]
        shared += len(inside) > 1
    assert shared > 0  # some span was seen in two windows and answered once
    for w in windows:  # every window's span lies in exactly one merged span of its label
        for s in w["spans"]:
            covering = [m for m in merged if m["label"] == s["label"] and m["start"] <= s["start"] < m["end"]]
            assert len(covering) == 1


def test_a_short_input_in_windows_answers_as_without(client) -> None:  # type: ignore[no-untyped-def]
    plain = _post(client, {"input": TEXTS[2]})["results"][0]["spans"]
    windowed = _post(client, {"input": TEXTS[2], "options": {"overflow": "window"}})["results"][0]["spans"]
    assert plain == windowed


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"input": "x", "options": {"aggregation": "max"}}, "options.aggregation"),
        ({"input": "x", "options": {"overflow": "window", "window": {"tokens": 999}}}, "options.window.tokens"),
        ({"input": "x", "options": {"max_tokens": 999}}, "options.max_tokens"),
        ({"input": "x", "head": "spans"}, "unknown head"),
    ],
)
def test_bad_options_are_400_naming_the_field(client, body: dict[str, Any], needle: str) -> None:  # type: ignore[no-untyped-def]
    error = _post(client, body, 400)["error"]
    assert error["code"] == "invalid_request" and needle in error["message"]


@pytest.mark.parametrize(
    ("item", "code"),
    [
        ({"text": "a", "text_pair": "b"}, "invalid_input"),  # a token head labels one text
        ({"context": "c", "question": "q", "answer": "a"}, "invalid_input"),  # no grounded head
        ("x " * 200, "max_length_exceeded"),
    ],
)
def test_an_input_the_head_cannot_read_fails_in_its_slot(client, item: Any, code: str) -> None:  # type: ignore[no-untyped-def]
    body = _post(client, {"input": [TEXTS[0], item, TEXTS[2]]})
    first, failed, last = body["results"]
    assert failed == {"index": 1, "error": code, "message": failed["message"]} and "input[1]" in failed["message"]
    assert first["spans"] == _post(client, {"input": TEXTS[0]})["results"][0]["spans"] and "spans" in last


def test_token_options_on_a_sequence_head_are_400(client) -> None:  # type: ignore[no-untyped-def]
    for name, value in (("aggregation", "first"), ("return_tokens", True), ("threshold", 0.5)):
        r = client.post("/v1/classify", json={"model": "tiny-classify", "input": "x", "options": {name: value}})
        assert r.status_code == 400 and f"options.{name}" in r.json()["error"]["message"]
    ok = client.post("/v1/classify", json={"model": "tiny-classify", "input": "x"}).json()
    assert ok["kind"] == "sequence" and "probabilities" in ok["results"][0]


def test_card_heads_say_token_and_the_labels(client) -> None:  # type: ignore[no-untyped-def]
    cards = {c["id"]: c for c in client.get("/v1/models").json()["data"]}
    (head,) = cards["tiny-token"]["heads"]
    assert head["kind"] == "token" and head["labels"] == ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    assert cards["tiny-classify"]["heads"][0]["kind"] == "sequence"
    assert cards["tiny-token"]["golden"]["status"] == "matched"
