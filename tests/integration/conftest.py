"""Fixtures for the encoder-model integration tests: tiny random `transformers` BERT/RoBERTa
classifiers saved with `save_pretrained`, next to a WordPiece tokenizer built in code."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from vllm_srun.adapters.families.fixtures.wordpiece_fixture import write_tiny_wordpiece_tokenizer

TINY_WORDS = [
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
    "movie",
    "film",
    "great",
    "terrible",
    "plot",
    "actor",
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
]


def _scramble(model: torch.nn.Module, seed: int) -> None:
    """Replace the near-trivial default init with larger random values, so parity is a real test."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if "LayerNorm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * noise)
            else:
                p.copy_(0.3 * noise)


@pytest.fixture
def tiny_classifier_factory(tmp_path: Path) -> Callable[..., Path]:
    """make(num_labels, hidden_act="gelu", model_type="bert", problem_type=None, seed=0) → folder."""
    transformers = pytest.importorskip("transformers")

    def make(
        num_labels: int,
        hidden_act: str = "gelu",
        model_type: str = "bert",
        problem_type: str | None = None,
        seed: int = 0,
    ) -> Path:
        folder = tmp_path / f"{model_type}-{num_labels}-{hidden_act}-{seed}"
        vocab = write_tiny_wordpiece_tokenizer(folder, TINY_WORDS)
        labels = {i: f"label_{chr(97 + i)}" for i in range(num_labels)}
        common = dict(
            vocab_size=len(vocab),
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            hidden_act=hidden_act,
            num_labels=num_labels,
            id2label=labels,
            label2id={v: k for k, v in labels.items()},
            problem_type=problem_type,
        )
        if model_type == "roberta":
            cfg = transformers.RobertaConfig(**common, max_position_embeddings=130, type_vocab_size=1, pad_token_id=0)
            model = transformers.RobertaForSequenceClassification(cfg)
        else:
            cfg = transformers.BertConfig(**common, max_position_embeddings=128, type_vocab_size=2)
            model = transformers.BertForSequenceClassification(cfg)
        _scramble(model, seed)
        model.eval().save_pretrained(folder)
        return folder

    return make


@pytest.fixture(scope="session")
def fake_packages(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two packages of the fake family (every surface, no torch), served as `fake-a` and `fake-b`."""
    from tests.integration.test_fake_family import registries
    from tests.stores import session_store
    from vllm_srun.app.fixtures import write_fixture

    families, engines = registries()
    root = tmp_path_factory.mktemp("fake-packages")
    return [
        write_fixture(root / name, "fake", "all", 0, families=families, engines=engines, store=session_store())
        for name in ("fake-a", "fake-b")
    ]
