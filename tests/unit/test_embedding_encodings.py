"""Quantized encodings, sparse cuts and MaxSim (issue 24), against their references: our
`quantize` bit for bit against sentence-transformers' `quantize_embeddings` with the same ranges,
the sparse top_k/threshold cut and MaxSim against plain loops."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from vllm_srun.adapters.contracts.outputs import SparseVector
from vllm_srun.adapters.surfaces.embedding_outputs import OutputPlan, sparse_answer
from vllm_srun.adapters.surfaces.encodings import quantize, ranges_for, wire
from vllm_srun.adapters.surfaces.maxsim import maxsim
from vllm_srun.domain.errors import InvalidRequest

quantization = pytest.importorskip("sentence_transformers.util.quantization")
PRECISIONS = ("int8", "uint8", "binary", "ubinary")
floats = st.floats(-4, 4, width=32, allow_nan=False)


def _normalized(raw: np.ndarray) -> np.ndarray:
    return (raw / np.maximum(np.linalg.norm(raw, axis=1, keepdims=True), 1e-6)).astype(np.float32)


@settings(max_examples=60, deadline=None)
@given(
    arrays(np.float32, st.tuples(st.integers(1, 6), st.integers(1, 40)), elements=floats), st.sampled_from(PRECISIONS)
)
def test_fixed_ranges_equal_sentence_transformers_bit_for_bit(raw: np.ndarray, precision: str) -> None:
    vectors = _normalized(raw)

    class Normalized:
        embedding_ranges = None

    ranges, source = ranges_for(Normalized(), precision, vectors.shape[1], True, "encoding_format")
    ours = quantize(vectors, precision, ranges)
    theirs = quantization.quantize_embeddings(vectors, precision, ranges=ranges)
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    assert ours.tobytes() == theirs.tobytes()
    assert source == ("fixed" if precision in ("int8", "uint8") else None)


@settings(max_examples=60, deadline=None)
@given(
    arrays(np.float32, st.tuples(st.integers(1, 6), st.just(12)), elements=floats),
    arrays(np.float32, (2, 12), elements=floats),
    st.sampled_from(("int8", "uint8")),
)
def test_package_ranges_equal_sentence_transformers_bit_for_bit(
    vectors: np.ndarray, bounds: np.ndarray, precision: str
) -> None:
    lows, highs = np.minimum(bounds[0], bounds[1]), np.maximum(bounds[0], bounds[1])

    class Shipped:
        embedding_ranges = (tuple(lows.tolist()), tuple(highs.tolist()))

    ranges, source = ranges_for(Shipped(), precision, 12, False, "encoding_format")
    assert source == "package"
    with np.errstate(over="ignore"):  # theirs warns where a range is subnormally narrow; ours clips quietly
        theirs = quantization.quantize_embeddings(vectors, precision, ranges=ranges)
    assert quantize(vectors, precision, ranges).tobytes() == theirs.tobytes()


def test_ranges_of_a_cut_vector_are_the_kept_dimensions() -> None:
    class Shipped:
        embedding_ranges = ((-2.0, -3.0, -4.0), (2.0, 3.0, 4.0))

    ranges, _ = ranges_for(Shipped(), "int8", 2, False, "encoding_format")
    assert ranges.tolist() == [[-2.0, -3.0], [2.0, 3.0]]


def test_int8_without_ranges_or_normalization_is_refused_naming_the_field() -> None:
    with pytest.raises(InvalidRequest, match=r"^embedding_types int8 needs calibration ranges"):
        ranges_for(object(), "int8", 8, False, "embedding_types")
    assert ranges_for(object(), "binary", 8, False, "embedding_types") == (None, None)


def test_base64_is_the_bytes_of_each_encoding() -> None:
    v = np.array([0.5, -0.25, 1.0], dtype=np.float32)
    assert np.frombuffer(base64.b64decode(wire(v, True)), "<f4").tolist() == v.tolist()
    q = np.array([-128, 0, 127], dtype=np.int8)
    assert np.frombuffer(base64.b64decode(wire(q, True)), np.int8).tolist() == [-128, 0, 127]
    assert wire(q, False) == [-128, 0, 127]


sparse_values = st.lists(st.floats(0.0, 5.0, width=32, exclude_min=True), min_size=0, max_size=30)


@settings(max_examples=100, deadline=None)
@given(sparse_values, st.integers(1, 40) | st.none(), st.floats(0, 5) | st.none())
def test_sparse_cut_keeps_the_largest_weights_above_the_threshold(
    values: list[float], top_k: int | None, threshold: float | None
) -> None:
    indices = sorted(np.random.default_rng(len(values)).choice(1000, len(values), replace=False).tolist())
    vector = SparseVector(indices, np.asarray(values, dtype=np.float32).tolist())
    got = sparse_answer(vector, OutputPlan("sparse", "float", False, top_k=top_k, threshold=threshold))
    pairs = [(i, v) for i, v in zip(vector.indices, vector.values) if threshold is None or v > threshold]
    pairs.sort(key=lambda p: (-p[1], p[0]))
    if top_k is not None:
        pairs = pairs[:top_k]
    pairs.sort()
    assert got.indices == [i for i, _ in pairs]
    assert got.values == [v for _, v in pairs]


@settings(max_examples=40, deadline=None)
@given(
    arrays(np.float32, st.tuples(st.integers(1, 5), st.just(6)), elements=floats),
    arrays(np.float32, st.tuples(st.integers(1, 7), st.just(6)), elements=floats),
)
def test_maxsim_is_the_sum_of_each_query_tokens_best_match(query: np.ndarray, doc: np.ndarray) -> None:
    expected = sum(max(float(np.dot(q.astype(np.float64), d.astype(np.float64))) for d in doc) for q in query)
    assert maxsim(query, doc) == pytest.approx(expected, rel=1e-9, abs=1e-9)
    assert maxsim(query[:0], doc) == 0.0
