"""Quantized embedding encodings per request (issue 24): `int8`, `uint8`, `binary`, `ubinary`,
computed as sentence-transformers' `quantize_embeddings` computes them (bit for bit: the same numpy
operations on float32 vectors and float32 ranges), shared by `/v1/embeddings` and `/v2/embed`.

- int8 / uint8: per dimension, `floor((x - min) / step)` clipped to [0, 255] with `step = (max -
  min) / 255` (a zero step counts as 1); int8 subtracts 128. The ranges are the package's
  calibration ranges (`embedding_ranges.json`) when it ships them, else the fixed [-1, 1] of a
  normalized model; a model with neither cannot answer int8/uint8 (400). With `dimensions`, the
  ranges of the kept dimensions.
- binary / ubinary: the sign bits (`x > 0`) packed 8 to a byte, big-endian bit order;
  binary subtracts 128 (signed bytes).
- base64: the little-endian float32 bytes for float, the bytes themselves for the quantized ones.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

from vllm_srun.adapters.contracts.outputs import has_quantization_ranges
from vllm_srun.domain.errors import InvalidRequest

RANGED = ("int8", "uint8")
FIXED_RANGE = (-1.0, 1.0)


def ranges_for(model: object, precision: str, dimensions: int, normalized: bool, field: str) -> tuple[Any, str | None]:
    """(float64 [2, DIMENSIONS] ranges, where they come from) for PRECISION, (None, None) when it
    needs none; InvalidRequest naming FIELD when the model has none."""
    if precision not in RANGED:
        return None, None
    shipped = model.embedding_ranges if has_quantization_ranges(model) else None
    if shipped is not None:
        return np.array([shipped[0][:dimensions], shipped[1][:dimensions]], dtype=np.float64), "package"
    if normalized:
        return np.array([[FIXED_RANGE[0]] * dimensions, [FIXED_RANGE[1]] * dimensions], dtype=np.float64), "fixed"
    raise InvalidRequest(
        f"{field} {precision} needs calibration ranges: this model's vectors are not normalized and its package "
        "has no embedding_ranges.json (binary and ubinary need none)"
    )


def quantize(vectors: np.ndarray, precision: str, ranges: np.ndarray | None = None) -> np.ndarray:
    """VECTORS (float32 [N, D]) at PRECISION (module doc)."""
    if precision in ("float", "float32", "base64"):
        return vectors.astype(np.float32)
    if precision in RANGED:
        assert ranges is not None, "int8/uint8 need ranges"
        r = ranges.astype(np.float32, copy=False)
        starts = r[0, :]
        steps = (r[1, :] - starts) / 255
        steps = np.where(steps == 0, 1, steps)
        with np.errstate(over="ignore"):  # a range narrower than float32 resolves: +-inf, clipped to 0 or 255
            q = np.clip(np.floor((vectors - starts) / steps), 0, 255)
        return q.astype(np.uint8) if precision == "uint8" else (q - 128).astype(np.int8)
    if precision == "binary":
        return (np.packbits(vectors > 0, axis=-1) - 128).astype(np.int8)
    if precision == "ubinary":
        return np.packbits(vectors > 0, axis=-1)
    raise ValueError(f"unknown precision {precision!r}")


def wire(row: np.ndarray, as_base64: bool) -> list[Any] | str:
    """One encoded row as JSON numbers, or base64 of its bytes (float: little-endian float32)."""
    if not as_base64:
        return row.tolist()
    raw = np.ascontiguousarray(row, dtype="<f4") if row.dtype.kind == "f" else np.ascontiguousarray(row)
    return base64.b64encode(raw.tobytes()).decode("ascii")
