"""R-GOLD-1 comparison rules and the R-BAT-5 batch-invariance probe, against fakes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tests.fakes import FakeForward
from vllm_srun.adapters.readiness.golden import compare, pick_reference, project
from vllm_srun.adapters.readiness.probe import batch_invariant, probe_batches


def test_compare_floats_within_tolerance_everything_else_exactly() -> None:
    want = {"labels": ["a", "b"], "results": [{"index": 0, "label": "a", "probabilities": [0.25, 0.75], "n": 3}]}
    near = {"labels": ["a", "b"], "results": [{"index": 0, "label": "a", "probabilities": [0.2505, 0.7495], "n": 3}]}
    assert compare(want, near, 1e-3) is None
    assert "probabilities[0]" in compare(want, near, 1e-4)  # type: ignore[operator]
    assert compare(want, {**near, "labels": ["a", "c"]}, 1) is not None
    assert compare({"n": 3}, {"n": 4}, 10) is not None  # counts are exact
    assert compare({"x": True}, {"x": 1}, 1) is not None
    assert compare([1.0], [float("nan")], 1) is not None
    assert compare([1.0, 2.0], [1.0], 1) is not None


def test_project_drops_name_meta_id_and_orders_results_by_index() -> None:
    body = {
        "model": "m",
        "id": "x",
        "meta": {"forwards": 1},
        "results": [{"index": 2, "relevance_score": 0.9}, {"index": 0, "relevance_score": 0.8}],
    }
    assert project(body) == {"results": [{"index": 0, "relevance_score": 0.8}, {"index": 2, "relevance_score": 0.9}]}


def test_reference_by_dtype_preferring_the_device_class() -> None:
    golden = {
        "references": [
            {"device": "cpu", "dtype": "float32"},
            {"device": "gpu", "dtype": "float32"},
            {"device": "cpu", "dtype": "bfloat16"},
        ]
    }
    assert pick_reference(golden, "cuda:0", "float32") == {"device": "gpu", "dtype": "float32"}
    assert pick_reference(golden, "cpu", "float32") == {"device": "cpu", "dtype": "float32"}
    assert pick_reference(golden, "cuda:0", "bfloat16") == {"device": "cpu", "dtype": "bfloat16"}
    assert pick_reference(golden, "cpu", "float16") is None


def test_probe_tells_invariant_from_variant_engines() -> None:
    rows = [float(i) for i in range(5)]
    assert batch_invariant(FakeForward().run, "text", rows)
    assert not batch_invariant(FakeForward(batch_variant=True).run, "text", rows)
    engine = FakeForward()
    batch_invariant(engine.run, "text", rows)
    sizes = [len(payloads) for _, payloads in engine.forwards]
    assert sizes[:5] == [1] * 5 and max(sizes) == 5  # alone, then mixed batches
    assert probe_batches(1) == [] and all(sorted(set(b)) == sorted(b) for b in probe_batches(6))


def test_probe_catches_a_difference_in_the_last_bit() -> None:
    def run(lane: str, payloads: Sequence[Any]) -> list[Any]:
        out = [np.float32(p) for p in payloads]
        if len(payloads) > 2:
            out[-1] = np.nextafter(out[-1], np.float32(np.inf))
        return out

    assert not batch_invariant(run, "text", [1.0, 2.0, 3.0])
