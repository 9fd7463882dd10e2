"""The texts of the load benchmarks: *short* (1–20 words, like routing prompts), *mixed*
(1–160 words) and *long* (200–256 tokens with MiniLM's tokenizer, [CLS] and [SEP] included: up to
its 256-token limit, never past it), drawn from a fixed vocabulary by seed, so every benchmark and
every peer sees the same inputs.

A long text is 198–254 words drawn from the words that MiniLM's WordPiece vocabulary keeps whole
(`ONE_PIECE`: every word of `WORDS` but the few it splits, `SPLIT`), so its token count is its word
count + 2. `bench/peers.py` tokenizes every text it sends and says so if a long one falls outside.
"""

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

# words of WORDS that bert-base-uncased's WordPiece vocabulary (MiniLM's) splits into several pieces
SPLIT = frozenset({"refund", "invoice", "login", "escalate"})
ONE_PIECE = [w for w in WORDS if w not in SPLIT]

# (fewest, most) words of a text of the shape, and the words it is drawn from
SHAPES: dict[str, tuple[int, int, list[str]]] = {
    "short": (1, 20, WORDS),
    "mixed": (1, 160, WORDS),
    "long": (198, 254, ONE_PIECE),  # 200–256 tokens with [CLS] and [SEP]
}
LONG_TOKENS = (200, 256)


def make_texts(shape: str, n: int, seed: int = 0) -> list[str]:
    if shape not in SHAPES:
        raise ValueError(f"unknown text shape {shape!r} (one of {', '.join(SHAPES)})")
    rng = random.Random(seed)
    fewest, most, words = SHAPES[shape]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(fewest, most))) for _ in range(n)]
