"""Bicubic resizing of 8-bit images with antialiasing, in the fixed-point arithmetic of torch's CPU
`interpolate(uint8, mode="bicubic", antialias=True)` — what torchvision's `resize` runs on a CPU
for uint8 frames, and so what transformers' Qwen3-VL video processor does to every frame. Numpy
only (media worker processes never import torch).

Each axis is resampled on its own, columns first, then rows (an axis whose size does not change
is left alone), with an 8-bit result after each pass:
- output pixel i of an axis scaled by s = in/out reads the input pixels whose centres lie within
  `support` = 2·s (2 when enlarging) of its centre s·(i + ½), weighted by the Keys cubic
  (a = −½) at their distance divided by max(s, 1), the weights normalised to sum to 1;
- the weights become 16-bit integers at the largest power-of-two scale 2^p for which the largest
  weight of the axis, rounded, stays below 2^15; each output is Σ pixel·weight + 2^(p−1), shifted
  right by p, clamped to 0..255.
"""

from __future__ import annotations

import math

import numpy as np


def _cubic(x: np.ndarray, a: float = -0.5) -> np.ndarray:
    x = np.abs(x)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))


def axis_weights(size_in: int, size_out: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(first input index [out], integer weights [out, taps], precision p) of one axis."""
    scale = size_in / size_out
    support = 2.0 * scale if scale >= 1.0 else 2.0
    inverse = 1.0 / scale if scale >= 1.0 else 1.0
    taps = math.ceil(support) * 2 + 1
    centers = scale * (np.arange(size_out, dtype=np.float64) + 0.5)
    first = np.maximum((centers - support + 0.5).astype(np.int64), 0)
    last = np.minimum((centers + support + 0.5).astype(np.int64), size_in)
    count = last - first
    k = np.arange(taps)
    weights = _cubic((k[None, :] + first[:, None] - centers[:, None] + 0.5) * inverse)
    weights = np.where(k[None, :] < count[:, None], weights, 0.0)
    total = weights.sum(axis=1, keepdims=True)
    weights = np.divide(weights, total, out=np.zeros_like(weights), where=total != 0)
    top = weights.max()
    precision = 0
    while precision < 22 and int(0.5 + top * (1 << (precision + 1))) < (1 << 15):
        precision += 1
    scaled = weights * (1 << precision)
    fixed = np.where(scaled < 0, (-0.5 + scaled).astype(np.int64), (0.5 + scaled).astype(np.int64))
    fixed = np.where(k[None, :] < count[:, None], fixed, 0)
    return first, fixed, precision


def _pass(array: np.ndarray, axis: int, size_out: int) -> np.ndarray:
    """Resample AXIS (0: rows, 1: columns) of [H, W, C] uint8 to SIZE_OUT. Sums stay below 2^31
    (255 × weights summing to about 2^p ≤ 2^16), so 32-bit integers hold them exactly."""
    size_in = array.shape[axis]
    first, weights, precision = axis_weights(size_in, size_out)
    source = array.astype(np.int32)
    shape = [1, 1, 1]
    shape[axis] = size_out
    acc = np.full(
        tuple(size_out if d == axis else n for d, n in enumerate(array.shape)),
        1 << (precision - 1) if precision else 0,
        dtype=np.int32,
    )
    for k in range(weights.shape[1]):
        column = weights[:, k]
        if not column.any():
            continue
        index = np.minimum(first + k, size_in - 1)
        acc += np.take(source, index, axis=axis) * column.astype(np.int32).reshape(shape)
    return np.clip(acc >> precision, 0, 255).astype(np.uint8)


def resize_bicubic_aa(array: np.ndarray, height: int, width: int) -> np.ndarray:
    """[H, W, C] uint8 → [HEIGHT, WIDTH, C] uint8 (module doc)."""
    if array.dtype != np.uint8 or array.ndim != 3:
        raise ValueError("resize_bicubic_aa takes [H, W, C] uint8")
    if height < 1 or width < 1:
        raise ValueError(f"cannot resize to {width}x{height}")
    out = array
    if width != out.shape[1]:
        out = _pass(out, 1, width)
    if height != out.shape[0]:
        out = _pass(out, 0, height)
    return np.ascontiguousarray(out)
