"""The batch-invariance probe (R-BAT-5): does a model answer a row bit-identically alone and
inside mixed batches? Run at load, after warm-up, on the device thread. A model that passes is
scheduled without a batch window, in merged forwards of at most 512 padded tokens (fewer where
its engine changes kernels below 512: `LoadedModel.invariant_tokens`), and reports
`numerics: exact`; any other model reports `approximate`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from vllm_srun.adapters.contracts import LoadedModel

RunBatch = Callable[[str, Sequence[Any]], Sequence[Any]]


def _same(a: Any, b: Any) -> bool:
    x, y = np.asarray(a), np.asarray(b)
    return x.shape == y.shape and x.dtype == y.dtype and x.tobytes() == y.tobytes()


def probe_batches(n: int) -> list[list[int]]:
    """Mixed batches over N probe rows: all of them both ways round, and longest with shortest."""
    if n < 2:
        return []
    everything = list(range(n))
    return [everything, everything[::-1], [0, n - 1], [n - 1, n // 2, 0], everything[1::2] + everything[::2]]


def batch_invariant(run: RunBatch, lane: str, rows: Sequence[Any]) -> bool:
    """True when every row's answer inside every probe batch equals its answer alone, bit for bit."""
    alone = [run(lane, [row])[0] for row in rows]
    for batch in probe_batches(len(rows)):
        outputs = run(lane, [rows[i] for i in batch])
        if not all(_same(out, alone[i]) for i, out in zip(batch, outputs)):
            return False
    return True


def probe_model(model: LoadedModel) -> bool | None:
    """Probe a loaded model with its family's probe rows; None when the family offers none.

    False without a probe when the model's engine changes kernels below `MIN_INVARIANT_TOKENS`
    (e.g. the oneDNN fast path measured not slower only for small forwards): merged forwards
    could not stay on the kernels the probe checks. Between that and 512 the merged forwards
    stop at the switch (`LoadedModel.invariant_tokens`), and the probe's batches fit under it."""
    if model.invariant_tokens is None:
        return False
    rows = model.probe_payloads()
    if len(rows) < 2:
        return None
    return batch_invariant(model.run, model.lanes[0].name, rows)
