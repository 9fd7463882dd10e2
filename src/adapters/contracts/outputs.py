"""Embedding outputs beyond one dense vector (issue 24): what `/v1/embeddings`, `/v2/embed` and
`/v1/rerank` ask of a model that has them.

- `OUTPUT_KINDS`: `dense` (one pooled vector per input), `sparse` (a SPLADE vector over the
  vocabulary: `SparseVector`), `multi_vector` (one L2-normalised vector per token, ColBERT-style:
  a float32 [tokens, dimensions] array).
- `TokenOutputRow`: the payload of a row that asks for a sparse or a multi-vector output (a plain
  `Encoded` payload asks for the dense vector, a `LogitsRow` for the classification head).
- `OutputKinds`: a text embedder that says which kinds it has (the card's `embedding.outputs`);
  a model without it has `dense` only.
- `QuantizationRanges`: a text embedder whose package ships calibration ranges for int8/uint8
  encodings (`embedding_ranges.json`), else None.
- `MaxSimScorer`: a model whose `/v1/rerank` scores by MaxSim over multi-vector outputs instead of
  a classification head.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from vllm_srun.adapters.contracts.capability import Capability
from vllm_srun.adapters.contracts.common import Encoded

__all__ = [
    "OUTPUT_KINDS",
    "MaxSimScorer",
    "OutputKinds",
    "QuantizationRanges",
    "SparseVector",
    "TokenOutputRow",
    "has_output_kinds",
    "has_quantization_ranges",
    "is_maxsim_scorer",
]

OUTPUT_KINDS = ("dense", "sparse", "multi_vector")


@dataclass(frozen=True, slots=True)
class TokenOutputRow:
    """A row answered by a token-level head: `kind` is `sparse` or `multi_vector`; a sparse row
    pools its special tokens' positions too when `keep_special` (sentence-transformers does)."""

    encoded: Encoded
    kind: str
    keep_special: bool = False


@dataclass(frozen=True, slots=True)
class SparseVector:
    """A sparse row's output: vocabulary ids (ascending) and their weights (> 0)."""

    indices: Sequence[int]
    values: Sequence[float]


@runtime_checkable
class OutputKinds(Protocol):
    """Which `OUTPUT_KINDS` the model serves, and the width of its multi-vector rows (0: none)."""

    output_kinds: frozenset[str]
    multi_vector_dimensions: int


@runtime_checkable
class QuantizationRanges(Protocol):
    """The package's int8/uint8 calibration ranges: ([min per dimension], [max per dimension]), or None."""

    embedding_ranges: tuple[tuple[float, ...], tuple[float, ...]] | None


@runtime_checkable
class MaxSimScorer(Protocol):
    """`/v1/rerank` by MaxSim: `rerank_scoring` is `maxsim` for such a model."""

    rerank_scoring: str


# the checks a surface makes on every request (`capability.py`: remembered per model)
has_output_kinds: Capability[OutputKinds] = Capability(OutputKinds)
has_quantization_ranges: Capability[QuantizationRanges] = Capability(QuantizationRanges)
is_maxsim_scorer: Capability[MaxSimScorer] = Capability(MaxSimScorer)
