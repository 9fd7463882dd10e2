"""On a real GPU (marked `gpu`, skipped without one): the device adapter, and every family's
answers on the GPU equal its answers on the CPU within the golden GPU tolerance (2e-2, R-GOLD-1),
with weights on the GPU; a worker on the GPU calibrates its token budget (R-DEV-2).
`bench/gpu_check.py` measures the rest (kernel timings, throughput)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.integration.serving import serving
from vllm_srun.adapters.contracts import LoadContext, LogitsRow
from vllm_srun.adapters.devices.torch_devices import CpuDevice, open_device
from vllm_srun.adapters.engines.registry import EngineRegistry
from vllm_srun.adapters.families.decision import DecisionFamily
from vllm_srun.adapters.families.decision_rows import QuestionRow, SharedRow
from vllm_srun.adapters.families.encoder import EncoderFamily
from vllm_srun.domain.scheduling.rows import DEFAULT_LANE
from vllm_srun.domain.scheduling.shared_context import SHARED_LANE
from vllm_srun.domain.settings.devices import DeviceRefused
from vllm_srun.domain.settings.engine_args import EngineArgs

pytestmark = pytest.mark.gpu
GOLDEN_GPU_TOLERANCE = 2e-2
TEXTS = ["a", "the quick brown fox jumps over the lazy dog", "paris is the capital of france " * 9, "red"]


def _flat(answers: list) -> np.ndarray:  # type: ignore[type-arg]
    """Every probability of every row (a shared row answers a list of questions)."""
    parts = [a for row in answers for a in (row if isinstance(row, list) else [row])]
    return np.concatenate([np.ravel(np.asarray(a, dtype=np.float64)) for a in parts])


def _context(device: object) -> LoadContext:
    return LoadContext(device=device, args=EngineArgs(), engines=EngineRegistry())  # type: ignore[arg-type]


def test_the_device_adapter_reads_the_gpu() -> None:
    device = open_device("cuda:0")
    assert device.memory_total() and 0 < (device.memory_free() or 0) <= (device.memory_total() or 0)
    assert {"float32", "float16"} <= device.native_dtypes
    with pytest.raises(DeviceRefused, match="GPU index out of range"):
        open_device(f"cuda:{torch.cuda.device_count()}")
    assert open_device("auto").kind in ("cuda", "rocm")


@pytest.mark.parametrize("variant", ["embed", "classify", "rerank"])
def test_encoder_on_the_gpu_equals_the_cpu(encoder_fixture, variant: str) -> None:  # type: ignore[no-untyped-def]
    folder = encoder_fixture(variant)
    gpu = EncoderFamily().load(folder, _context(open_device("cuda:0")))
    cpu = EncoderFamily().load(folder, _context(CpuDevice()))
    assert next(gpu.reference.encoder.parameters()).device.type == "cuda"  # type: ignore[attr-defined]
    rows = cpu.tokenize(TEXTS, truncate=True)  # type: ignore[attr-defined]
    payloads = rows if "embeddings" in cpu.surfaces else [LogitsRow(r) for r in rows]
    got, want = np.stack(gpu.run(DEFAULT_LANE, payloads)), np.stack(cpu.run(DEFAULT_LANE, payloads))
    assert np.abs(got - want).max() <= GOLDEN_GPU_TOLERANCE


@pytest.mark.parametrize("variant", ["llama", "qwen3"])
def test_decision_on_the_gpu_equals_the_cpu(decision_fixture, variant: str) -> None:  # type: ignore[no-untyped-def]
    folder = decision_fixture(variant)
    gpu = DecisionFamily().load(folder, _context(open_device("cuda:0")))
    cpu = DecisionFamily().load(folder, _context(CpuDevice()))
    assert gpu.dtype == "bfloat16" and cpu.dtype == "float32"  # R-DT-1
    rows = [QuestionRow(tuple(range(3, 3 + n)), (0, 1, 2)) for n in (2, 9, 30)]
    for lane, payloads in ((DEFAULT_LANE, rows), (SHARED_LANE, [SharedRow(tuple(range(5, 40)), tuple(rows))])):
        got, want = gpu.run(lane, payloads), cpu.run(lane, payloads)
        assert np.abs(_flat(got) - _flat(want)).max() <= GOLDEN_GPU_TOLERANCE


def test_a_gpu_worker_calibrates_its_token_budget(minilm_dir) -> None:  # type: ignore[no-untyped-def]
    with serving([minilm_dir], device="cuda:0") as (client, _):
        card = client.get("/v1/models").json()["data"][0]
        args = card["engine_args"]
        assert card["ready"] and card["golden"]["status"] == "matched" and card["device"] == "cuda:0"
        assert args["max_num_batched_tokens_source"] == "calibrated" and args["calibration"]["status"] == "calibrated"
        assert args["max_num_batched_tokens"] <= 32_768
