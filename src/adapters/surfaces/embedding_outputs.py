"""What `/v1/embeddings` answers besides float vectors (issue 24): the checks of `embedding_type`,
the sparse options and `encoding_format` against the model, made before any row is built, and
the rendering of each kind's outputs.

- `embedding_type` must be one of the model's outputs (`contracts/outputs.OutputKinds`; a model
  without it has `dense` only) — else 400 naming `embedding_type` and listing them.
- sparse: `options.top_k` (the K largest weights; ties: the lower id), `options.threshold`
  (weights above it), `options.special_tokens`; the answer is `{indices, values}`, ids ascending.
  These options on another kind: 400 naming the option.
- multi_vector: a list of per-token vectors (or base64 of the row-major float32 [tokens, D] bytes).
- `dimensions`, media inputs and the quantized encodings are dense-only (400 otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from vllm_srun.adapters.contracts.outputs import SparseVector, has_output_kinds
from vllm_srun.adapters.schemas.embeddings import (
    QUANTIZED,
    EmbeddingsOptions,
    EmbeddingsRequest,
    InputItem,
    Quantization,
    SparseEmbedding,
    TextInput,
)
from vllm_srun.adapters.surfaces.encodings import quantize, ranges_for, wire
from vllm_srun.domain.errors import InvalidRequest


@dataclass(frozen=True)
class OutputPlan:
    kind: str  # dense | sparse | multi_vector
    precision: str  # float | int8 | uint8 | binary | ubinary
    as_base64: bool
    keep_special: bool = False
    top_k: int | None = None
    threshold: float | None = None
    ranges: Any = None  # float64 [2, D] for int8/uint8
    ranges_from: str | None = None

    def quantization(self) -> Quantization | None:
        if self.precision not in QUANTIZED:
            return None
        ranges = self.ranges.tolist() if self.ranges is not None else None
        return Quantization(self.precision, ranges, self.ranges_from)


def model_outputs(model: object) -> frozenset[str]:
    return model.output_kinds if has_output_kinds(model) else frozenset({"dense"})


def output_plan(model: Any, req: EmbeddingsRequest, options: EmbeddingsOptions, items: list[InputItem]) -> OutputPlan:
    """REQ's output, checked against MODEL (module doc); InvalidRequest naming the field."""
    kinds = model_outputs(model)
    kind = req.embedding_type
    if kind not in kinds:
        have = ", ".join(k for k in ("dense", "sparse", "multi_vector") if k in kinds)
        raise InvalidRequest(f"embedding_type {kind!r} is not an output of this model (its outputs: {have})")
    fmt = req.encoding_format
    precision = "float" if fmt == "base64" else fmt
    as_base64 = fmt == "base64" or req.base64
    if kind != "sparse":
        for name, value in (("top_k", options.top_k), ("threshold", options.threshold)):
            if value is not None:
                raise InvalidRequest(f"options.{name} applies to sparse embeddings (embedding_type sparse)")
        if options.special_tokens is not None:
            raise InvalidRequest("options.special_tokens applies to sparse embeddings (embedding_type sparse)")
    if kind == "dense":
        dims = req.dimensions or model.dimensions
        ranges, source = ranges_for(model, precision, dims, model.normalized, "encoding_format")
        return OutputPlan(kind, precision, as_base64, ranges=ranges, ranges_from=source)
    if req.dimensions is not None:
        raise InvalidRequest(f"dimensions applies to dense embeddings (embedding_type is {kind})")
    if precision != "float" or (kind == "sparse" and as_base64):
        allowed = "float" if kind == "sparse" else "float or base64"
        raise InvalidRequest(
            f"encoding_format {fmt}{' with base64' if req.base64 else ''}: {kind} embeddings are {allowed}"
        )
    bad = next((i for i, item in enumerate(items) if not isinstance(item, (str, TextInput))), None)
    if bad is not None:
        raise InvalidRequest(f"input[{bad}] is not text: {kind} embeddings are of texts")
    return OutputPlan(
        kind,
        "float",
        as_base64,
        keep_special=options.special_tokens != "exclude",  # unset: include, as SparseEncoder.encode
        top_k=options.top_k,
        threshold=options.threshold,
    )


def sparse_answer(vector: SparseVector, plan: OutputPlan) -> SparseEmbedding:
    """VECTOR cut to PLAN's threshold and top_k, ids ascending."""
    indices = np.asarray(vector.indices, dtype=np.int64)
    values = np.asarray(vector.values, dtype=np.float32)
    if plan.threshold is not None:
        keep = values.astype(np.float64) > plan.threshold  # the threshold as sent, not rounded to float32
        indices, values = indices[keep], values[keep]
    if plan.top_k is not None and len(values) > plan.top_k:
        order = np.lexsort((indices, -values))[: plan.top_k]  # largest first, the lower id on a tie
        order.sort()
        indices, values = indices[order], values[order]
    return SparseEmbedding(indices.tolist(), values.tolist())


def dense_answers(vectors: np.ndarray, plan: OutputPlan) -> list[list[Any] | str]:
    """Each row of VECTORS (float32 [N, D]) at PLAN's precision, as numbers or base64."""
    encoded = quantize(vectors, plan.precision, plan.ranges)
    return [wire(row, plan.as_base64) for row in encoded]


def multi_vector_answer(tokens: np.ndarray, plan: OutputPlan) -> list[Any] | str:
    return wire(np.asarray(tokens, dtype=np.float32).reshape(-1), True) if plan.as_base64 else tokens.tolist()
