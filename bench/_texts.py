"""The texts of the load benchmarks: *short* (1–20 words, like routing prompts) and *mixed*
(1–160 words), drawn from a fixed vocabulary by seed, so every benchmark and every peer sees the
same inputs."""

from __future__ import annotations

import random

WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "for",
    "on",
    "that",
    "with",
    "as",
    "by",
    "at",
    "from",
    "this",
    "are",
    "be",
    "it",
    "or",
    "an",
    "have",
    "not",
    "which",
    "but",
    "model",
    "request",
    "route",
    "billing",
    "account",
    "refund",
    "invoice",
    "password",
    "reset",
    "shipping",
    "order",
    "delivery",
    "late",
    "question",
    "answer",
    "medical",
    "legal",
    "advice",
    "price",
    "plan",
    "upgrade",
    "cancel",
    "subscription",
    "error",
    "crash",
    "login",
    "weather",
    "travel",
    "flight",
    "hotel",
    "booking",
    "review",
    "product",
    "quality",
    "support",
    "agent",
    "human",
    "escalate",
    "urgent",
]

SHAPES = {"short": 20, "mixed": 160}  # the most words a text of the shape has


def make_texts(shape: str, n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    most = SHAPES[shape]
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, most))) for _ in range(n)]
