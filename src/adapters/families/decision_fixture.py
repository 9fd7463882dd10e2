"""Tiny random-weight decision packages (R-PKG-3), deterministic by seed, in Hugging Face layout.

Variants: `llama` (a SmolLM2-shaped Llama decoder: GQA, tied embeddings, ChatML tokens),
`qwen3` (Qwen3: per-head q/k RMSNorm, ChatML with `<think>` tokens), and the Qwen3.5 hybrid
backbone's `qwen3_5` (text-only) and `qwen3_5_mm` (the text part of a multimodal checkpoint),
written by `qwen3_5_fixture.py` with Qwen3.5's byte-level BPE tokenizer, and `qwen3_5_vision`
(`qwen3_5_vision_fixture.py`: the multimodal checkpoint with its vision tower and processor
configs, read whole; its golden requests add an image and a video question). Weights come from numpy's
PCG64 generator (FP32 safetensors), so a seed writes the same bytes everywhere; `srun.json`
declares the family's published precision (BF16) and spells out the prompt template. The
tokenizer is a small lowercase word-level one built in code: words, letters, letter pairs (option
keys), single digits (score levels), punctuation and the chat tokens.
"""

from __future__ import annotations

import json
from itertools import product
from pathlib import Path
from string import ascii_lowercase, punctuation
from typing import Any

import numpy as np

from vllm_srun.adapters.families.decision_package import write_decision_package

VARIANTS = ("llama", "qwen3", "qwen3_5", "qwen3_5_mm", "qwen3_5_vision")
HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE, POSITIONS = 64, 2, 4, 2, 16, 128, 1024
WORDS = [
    "the",
    "a",
    "an",
    "is",
    "are",
    "was",
    "were",
    "be",
    "been",
    "of",
    "to",
    "and",
    "in",
    "on",
    "for",
    "with",
    "not",
    "no",
    "yes",
    "this",
    "that",
    "it",
    "by",
    "at",
    "from",
    "as",
    "or",
    "but",
    "question",
    "answer",
    "options",
    "option",
    "levels",
    "level",
    "letter",
    "number",
    "one",
    "name",
    "means",
    "reply",
    "only",
    "which",
    "fits",
    "best",
    "applies",
    "you",
    "questions",
    "about",
    "content",
    "user",
    "gives",
    "what",
    "how",
    "does",
    "do",
    "did",
    "can",
    "could",
    "should",
    "would",
    "very",
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
    "calm",
    "angry",
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
    "review",
    "positive",
    "negative",
    "neutral",
    "mixed",
    "urgent",
    "spam",
    "message",
    "subject",
    "order",
    "refund",
    "billing",
    "team",
    "shipping",
    "account",
    "price",
    "money",
    "bank",
    "today",
    "tomorrow",
    "weather",
    "rain",
    "sun",
    "paris",
    "france",
    "capital",
    "city",
    "river",
    "sea",
    "help",
    "please",
    "charged",
    "twice",
    "wait",
    "week",
    "needs",
    "attention",
    "tone",
    "customer",
    "product",
    "damaged",
    "broken",
    "late",
    "early",
    "slow",
    "fast",
]
CHAT_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
THINK_TOKENS = ("<think>", "</think>")
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def write_decoder_tokenizer(folder: Path, specials: tuple[str, ...]) -> int:
    """A word-level tokenizer (tokenizer.json + tokenizer_config.json); returns its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    vocab: dict[str, int] = {}
    pairs = (a + b for a, b in product(ascii_lowercase, repeat=2))
    for token in (*specials, "<unk>", *WORDS, *ascii_lowercase, *pairs, *"0123456789", *punctuation):
        vocab.setdefault(token, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Whitespace(), pre_tokenizers.Punctuation(), pre_tokenizers.Digits(individual_digits=True)]
    )
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tok.add_special_tokens(list(specials))
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|im_end|>",
        "unk_token": "<unk>",
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": POSITIONS,
        "chat_template": CHAT_TEMPLATE,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return len(vocab)


def decoder_config(variant: str, vocab: int) -> dict[str, Any]:
    arch = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}[variant]
    return {
        "architectures": [arch],
        "model_type": variant,
        "vocab_size": vocab,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": POSITIONS,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": None,
        "eos_token_id": 2,
        "pad_token_id": 2,
        "torch_dtype": "bfloat16",
    }


def _tensors(config: dict[str, Any], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def normal(std: float, *shape: int) -> np.ndarray:
        return (std * rng.standard_normal(shape)).astype(np.float32)

    def norm(size: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(size)).astype(np.float32)

    qwen3 = config["model_type"] == "qwen3"
    out = {"model.embed_tokens.weight": normal(0.3, config["vocab_size"], HIDDEN)}
    q_size, kv_size = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = norm(HIDDEN)
        out[p + "post_attention_layernorm.weight"] = norm(HIDDEN)
        for name, rows, cols in (
            ("self_attn.q_proj", q_size, HIDDEN),
            ("self_attn.k_proj", kv_size, HIDDEN),
            ("self_attn.v_proj", kv_size, HIDDEN),
            ("self_attn.o_proj", HIDDEN, q_size),
            ("mlp.gate_proj", INTERMEDIATE, HIDDEN),
            ("mlp.up_proj", INTERMEDIATE, HIDDEN),
            ("mlp.down_proj", HIDDEN, INTERMEDIATE),
        ):
            out[f"{p}{name}.weight"] = normal(0.25, rows, cols)
        if qwen3:
            out[p + "self_attn.q_norm.weight"] = norm(HEAD_DIM)
            out[p + "self_attn.k_norm.weight"] = norm(HEAD_DIM)
    out["model.norm.weight"] = norm(HIDDEN)
    return out


def golden_requests() -> list[dict[str, Any]]:
    review = {
        "noul": {"type": "noul", "instructions": "is the review positive"},
        "tone": {
            "type": "choice",
            "instructions": "what is the tone",
            "criteria": {"positive": "a good review", "negative": None, "mixed": None},
        },
        "stars": {
            "type": "score",
            "instructions": "how good is the movie",
            "criteria": ["bad", "boring", "good", "great"],
        },
    }
    ticket = {
        "urgent": {"type": "noul", "criteria": {"true": "needs attention today", "false": None}},
        "team": {
            "type": "choice",
            "criteria": {"billing team": "money and refund", "shipping team": "late order", "account team": None},
        },
        "wait": {
            "type": "score",
            "instructions": "how long can it wait",
            "criteria": ["today", {"when": "this week"}, ["next", "week"]],
        },
    }
    return [
        {
            "surface": "systemone",
            "body": {"state": "the movie was great fun and the music was good", "questions": review},
        },
        {
            "surface": "systemone",
            "body": {
                "state": {"subject": "charged twice", "message": "please help refund my order"},
                "questions": ticket,
            },
        },
    ]


def write_decision_fixture(out: Path, variant: str | None, seed: int) -> list[dict[str, Any]]:

    variant = variant or "llama"
    if variant not in VARIANTS:
        raise ValueError(f"decision fixtures come in variants {', '.join(VARIANTS)} (got {variant!r})")
    if variant == "qwen3_5_vision":  # reads images and videos (qwen3_5_vision_fixture.py)
        from vllm_srun.adapters.families.qwen3_5_vision_fixture import golden_requests as media_requests
        from vllm_srun.adapters.families.qwen3_5_vision_fixture import write_qwen3_5_vision_fixture

        write_qwen3_5_vision_fixture(Path(out), seed, WORDS)
        return media_requests(golden_requests())
    if variant.startswith("qwen3_5"):
        from vllm_srun.adapters.families.qwen3_5_fixture import write_qwen3_5_fixture

        write_qwen3_5_fixture(Path(out), variant, seed, WORDS)
        return golden_requests()
    out = Path(out)
    specials = CHAT_TOKENS + (THINK_TOKENS if variant == "qwen3" else ())
    vocab = write_decoder_tokenizer(out, specials)
    config = decoder_config(variant, vocab)
    write_decision_package(
        out,
        config,
        _tensors(config, seed),
        template="chatml-think" if variant == "qwen3" else "chatml",
        max_input_tokens=POSITIONS,
        fixture={"variant": variant, "seed": seed},
    )
    return golden_requests()
