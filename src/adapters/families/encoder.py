"""The encoder family (R-PKG-2): BERT-style encoders serving embeddings (and, with a head,
classify / rerank). Rows are tokenized texts; one lane, padded accounting."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from vllm_srun.adapters.families.base import Family, LoadedModel, LoadOptions, Progress
from vllm_srun.domain.lanes import Accounting, Lane
from vllm_srun.domain.rows import DEFAULT_LANE

ENCODER_MODEL_TYPES = frozenset({"bert"})

# R-BAT-7: on a CPU a padded forward has a sweet spot; past it a forward is slower per row
# (bench/embeddings_load.py). Merged forwards of an encoder stay within this many padded tokens.
CPU_CAP_TOKENS = 4096


def read_config(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    if not path.exists():
        return {}
    return json.loads(path.read_text())


class EncoderModel(LoadedModel):
    family = "encoder"

    def __init__(self, folder: Path, options: LoadOptions, progress: Progress) -> None:
        import torch

        from vllm_srun.adapters.models.encoder_runner import EncoderRunner
        from vllm_srun.adapters.models.tokenization import TextTokenizer

        self.folder = folder
        progress(f"load: reading weights from {folder}")
        self.runner = EncoderRunner.from_folder(folder, dtype=torch.float32)
        self.tokenizer = TextTokenizer.from_folder(folder)
        self.pooling = self.runner.pooling
        cfg = self.runner.config
        self.max_input_tokens = min(self.pooling.max_seq_length or cfg.max_tokens, cfg.max_tokens)
        self.dimensions = self.runner.dimensions
        self.dtype = "float32"
        self.device = options.device
        self.engine = "native"
        self.batch_invariant = False
        self.surfaces = frozenset({"embeddings"})
        cap = CPU_CAP_TOKENS if options.device == "cpu" else None
        self.lanes = (Lane(DEFAULT_LANE, Accounting.PADDED, cap_tokens=cap),)

    def tokenize(self, texts: Sequence[str], *, truncate: bool) -> list[Any]:
        return self.tokenizer.encode(list(texts), max_length=self.max_input_tokens, truncate=truncate)

    def run(self, lane: str, payloads: Sequence[Any]) -> Sequence[Any]:
        return list(self.runner.embed(payloads))

    def describe(self) -> dict[str, Any]:
        return {
            "embedding": {
                "dimensions": self.dimensions,
                "normalized": self.pooling.normalize,
                "pooling": self.pooling.mode,
            }
        }


class EncoderFamily(Family):
    name = "encoder"

    def detect(self, folder: Path) -> bool:
        return read_config(folder).get("model_type") in ENCODER_MODEL_TYPES

    def load(self, folder: Path, options: LoadOptions, progress: Progress) -> LoadedModel:
        return EncoderModel(folder, options, progress)
