"""What the encoder family's fixture writers share (`encoder_fixture.py`, `decoder_head_fixture.py`,
`qwen3_5_encoder_fixture.py`): the tiny vocabulary every fixture tokenizer holds, the labels of each
kind of head, the requests a fixture's golden file records, and the sentence-transformers files of
a pooling package."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

WORDS = [
    "the",
    "a",
    "an",
    "is",
    "are",
    "was",
    "of",
    "to",
    "and",
    "in",
    "on",
    "for",
    "with",
    "not",
    "this",
    "that",
    "it",
    "be",
    "by",
    "at",
    "from",
    "as",
    "or",
    "but",
    "cat",
    "dog",
    "bird",
    "fish",
    "red",
    "blue",
    "green",
    "small",
    "large",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "happy",
    "sad",
    "good",
    "bad",
    "great",
    "terrible",
    "movie",
    "film",
    "plot",
    "actor",
    "acting",
    "music",
    "story",
    "boring",
    "fun",
    "love",
    "hate",
    "query",
    "document",
    "answer",
    "question",
    "relevant",
    "paris",
    "france",
    "capital",
    "city",
    "river",
    "mountain",
    "sea",
    "weather",
    "rain",
    "sun",
    "today",
    "tomorrow",
    "price",
    "money",
    "bank",
    "account",
    "order",
    "refund",
    "billing",
    "team",
]
LABELS = {
    "classify": ["negative", "neutral", "positive"],
    "multilabel": ["billing", "shipping", "urgent"],
    "token": ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"],
}
TOKEN_TEXTS = ["paris is the capital of france", "the quick brown fox jumps over the lazy dog", "x"]
LONG_TEXT = (
    "the movie was great fun and the music was good but the plot was boring and the acting "
    "was bad so the story is not great and the film is not fun at all today "
) * 3


POOLING_FLAGS = ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens", "weightedmean_tokens", "lasttoken")


def write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")


def golden_requests(variant: str, *, windows: bool = True) -> list[dict[str, Any]]:
    """The requests a fixture's golden file records; WINDOWS False: long inputs are cut
    (`overflow: truncate`) instead of windowed (a yes/no reranker's pairs cannot be windowed)."""
    window = {"overflow": "window", "window": {"tokens": 32, "overlap": 8}} if windows else {"overflow": "truncate"}
    if variant == "splade":
        sentences = ["the cat sat on the mat", "paris is the capital of france", "x"]
        return [
            {"surface": "embeddings", "body": {"input": sentences, "embedding_type": "sparse"}},
            {
                "surface": "embeddings",
                "body": {"input": sentences[1], "embedding_type": "sparse", "options": {"top_k": 5}},
            },
        ]
    if variant == "colbert":
        docs = ["paris is the capital of france", "the river flows to the sea", "a small cat"]
        return [
            {"surface": "embeddings", "body": {"input": ["a quick brown fox", "x"]}},
            {"surface": "embeddings", "body": {"input": ["capital of france"], "embedding_type": "multi_vector"}},
            {"surface": "rerank", "body": {"query": "capital of france", "documents": docs}},
        ]
    if variant == "token":
        windowed = {"overflow": "window", "window": {"tokens": 16, "overlap": 6}, "return_tokens": True}
        return [
            {"surface": "classify", "body": {"input": TOKEN_TEXTS}},
            {"surface": "classify", "body": {"input": TOKEN_TEXTS[:2], "options": {"aggregation": "first"}}},
            {"surface": "classify", "body": {"input": LONG_TEXT, "options": windowed}},
        ]
    if variant == "embed":
        return [
            {"surface": "embeddings", "body": {"input": ["the cat sat on the mat", "a quick brown fox", "x"]}},
            {"surface": "embeddings", "body": {"input": "happy music today", "dimensions": 16}},
        ]
    if variant == "rerank":
        docs = ["paris is the capital of france", "the river flows to the sea", "a small cat", LONG_TEXT]
        return [
            {
                "surface": "rerank",
                "body": {"query": "capital of france", "documents": docs[:3], "return_documents": True},
            },
            {"surface": "rerank", "body": {"query": "is the movie fun", "documents": docs, "options": window}},
        ]
    texts = [
        "this movie is great fun",
        "terrible plot and bad acting",
        {"text": "refund my order", "text_pair": "billing team"},
    ]
    first: dict[str, Any] = {"input": texts}
    if variant == "multilabel":
        first["options"] = {"threshold": 0.4}
    return [
        {"surface": "classify", "body": first},
        {"surface": "classify", "body": {"input": LONG_TEXT, "options": window}},
    ]


def pooling_files(out: Path, hidden: int, mode: str, positions: int, lowercase: bool) -> None:
    """modules.json (Transformer → Pooling → Normalize), the pooling config and sentence_bert_config.json."""
    write_json(
        out / "modules.json",
        [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
        ],
    )
    write_json(
        out / "1_Pooling" / "config.json",
        {"word_embedding_dimension": hidden, **{f"pooling_mode_{m}": m == mode for m in POOLING_FLAGS}},
    )
    (out / "2_Normalize").mkdir(exist_ok=True)
    write_json(out / "sentence_bert_config.json", {"max_seq_length": positions, "do_lower_case": lowercase})
