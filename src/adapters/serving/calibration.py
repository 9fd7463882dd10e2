"""The knee calibration of a GPU worker (R-DEV-2), timed on the device.

`KneeCalibrator.calibrate(model, limits, device)` runs on the device thread after the readiness
check: for each size the pure rule (`domain/worker/calibration.calibrate`) asks for, it runs the model's
calibration forward (`LoadedModel.calibration_forward`) once to warm it, then times it (best of
`repeats`, the device synchronized around each) and reads the device's memory peak; a forward that
runs out of device memory is recorded as such and ends the timing. The rule picks the budget.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from vllm_srun.adapters.contracts import Device, LoadedModel, Progress, quiet
from vllm_srun.domain.scheduling.lanes import round_up
from vllm_srun.domain.settings.devices import GPU_KINDS
from vllm_srun.domain.settings.engine_args import BatchingLimits
from vllm_srun.domain.worker.calibration import Calibration, CalibrationFailed, Timed, calibrate


def is_out_of_memory(exc: BaseException) -> bool:
    """torch's `OutOfMemoryError` (CUDA and HIP), told apart without importing torch here."""
    return type(exc).__name__ == "OutOfMemoryError" or "out of memory" in str(exc).lower()


class KneeCalibrator:
    def __init__(self, timer: Callable[[], float] = time.perf_counter, repeats: int = 2) -> None:
        self.timer = timer
        self.repeats = max(1, repeats)

    def applies(self, device: Device) -> bool:
        """Calibration runs on GPU workers only (R-DEV-2)."""
        return device.kind in GPU_KINDS

    def calibrate(
        self, model: LoadedModel, limits: BatchingLimits, device: Device, progress: Progress = quiet
    ) -> Calibration:
        """The calibrated budget for MODEL on DEVICE (CalibrationFailed when nothing could be timed)."""
        if model.calibration_forward(8) is None:
            raise CalibrationFailed(f"the {model.family} family offers no calibration forward")

        def measure(tokens: int) -> Timed:
            forward = model.calibration_forward(tokens)
            assert forward is not None
            try:
                model.run(forward.lane, forward.payloads)  # warm: kernels and allocator for this shape
                device.synchronize()
                device.reset_peak_memory()
                best = float("inf")
                for _ in range(self.repeats):
                    started = self.timer()
                    model.run(forward.lane, forward.payloads)
                    device.synchronize()
                    best = min(best, self.timer() - started)
            except Exception as exc:
                if not is_out_of_memory(exc):
                    raise
                progress(f"load: calibration forward of {forward.tokens} tokens ran out of device memory")
                return Timed(forward.tokens, None)
            progress(f"load: calibration forward of {forward.tokens} tokens took {best * 1000:.1f} ms")
            return Timed(forward.tokens, best, device.peak_memory())

        largest = limits.max_num_seqs * round_up(model.longest_row_tokens())
        return calibrate(
            measure,
            class_budget=limits.max_num_batched_tokens,
            largest_forward=largest,
            free_bytes=device.memory_free(),
        )
