"""Every family places its weights, buffers and every tensor its forwards create on its device
(R-DEV-3): each family loads and runs every lane on a fake GPU that torch calls `meta`, under a
guard that fails any op mixing the device with another (`tests/device_guard.py`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.device_guard import DeviceGuard, WrongDevice
from tests.fakes import FakeDevice
from vllm_srun.adapters.contracts import LoadContext, LoadedModel, LogitsRow
from vllm_srun.adapters.engines.registry import EngineRegistry
from vllm_srun.adapters.families.decision import DecisionFamily, DecisionModel
from vllm_srun.adapters.families.decision_rows import QuestionRow, SharedRow
from vllm_srun.adapters.families.encoder import EncoderFamily, EncoderModel
from vllm_srun.adapters.models import unpadded
from vllm_srun.adapters.models.decoder import DecoderLM
from vllm_srun.domain.scheduling.rows import DEFAULT_LANE
from vllm_srun.domain.scheduling.shared_context import SHARED_LANE
from vllm_srun.domain.settings.engine_args import EngineArgs

GPU = FakeDevice(kind="cuda", index=0, total=80 * 10**9, native_dtypes=frozenset({"float32", "bfloat16", "float16"}))
TEXTS = ["a", "the quick brown fox", "the quick brown fox jumps over the lazy dog " * 3, "red", "blue bird"]


def _context(device: FakeDevice = GPU, dtype: str = "auto") -> LoadContext:
    return LoadContext(device=device, args=EngineArgs(dtype=dtype), engines=EngineRegistry(), engine_choice="native")


def _on_meta(*modules: torch.nn.Module | None) -> bool:
    tensors = [t for m in modules if m is not None for t in (*m.parameters(), *m.buffers())]
    return bool(tensors) and all(t.device.type == "meta" for t in tensors)


def _encoder_payloads(model: EncoderModel) -> list[object]:
    rows = model.tokenize(TEXTS, truncate=True)
    if "embeddings" in model.surfaces:
        return list(rows)
    return [LogitsRow(r) for r in rows]


@pytest.mark.parametrize("variant", ["embed", "classify", "rerank"])
def test_encoder_forwards_stay_on_the_device(encoder_fixture, variant: str) -> None:  # type: ignore[no-untyped-def]
    with DeviceGuard() as guard:
        model = EncoderFamily().load(encoder_fixture(variant), _context())
        assert isinstance(model, EncoderModel)
        out = model.run(DEFAULT_LANE, _encoder_payloads(model))
        forward = model.calibration_forward(96)
        calibrated = model.run(forward.lane, forward.payloads)
    assert _on_meta(model.reference.encoder, model.reference.head)
    assert len(out) == len(TEXTS) and len(calibrated) == len(forward.payloads)
    assert guard.device_ops > 50 and guard.host_copies >= 2  # the forwards ran there; only answers came back
    assert model.lanes[0].cap_seconds == pytest.approx(0.3) and model.lanes[0].cap_tokens is None  # R-BAT-7 on a GPU
    kernels = model.card_section()["kernels"]
    assert kernels["triton"] is None and "meta" in kernels["reason"]  # Triton cannot launch on meta


@pytest.mark.parametrize("variant", ["llama", "qwen3"])
def test_decision_forwards_stay_on_the_device(decision_fixture, variant: str) -> None:  # type: ignore[no-untyped-def]
    with DeviceGuard() as guard:  # loading runs warm-up forwards of both lanes and the break-even timing
        model = DecisionFamily().load(decision_fixture(variant), _context())
        assert isinstance(model, DecisionModel)
        rows = [QuestionRow(tuple(range(3, 3 + n)), (0, 1, 2)) for n in (2, 9, 5)]
        text = model.run(DEFAULT_LANE, rows)
        shared = model.run(SHARED_LANE, [SharedRow(tuple(range(5, 17)), tuple(rows))])
        forward = model.calibration_forward(64)
        model.run(forward.lane, forward.payloads)
    lm = model.decoder_engine.lm  # type: ignore[attr-defined]
    assert isinstance(lm, DecoderLM) and _on_meta(lm) and lm.dtype == torch.bfloat16  # auto on a GPU: BF16
    assert [len(p) for p in text] == [3, 3, 3] and [len(p) for p in shared[0]] == [3, 3, 3]
    assert guard.device_ops > 50 and guard.host_copies >= 2
    assert all(lane.cap_seconds == pytest.approx(0.3) for lane in model.lanes)


def test_the_guard_catches_a_tensor_left_on_the_host(encoder_fixture, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """The proof can fail: index tensors built on the host and never moved are caught."""
    model = EncoderFamily().load(encoder_fixture("embed"), _context())
    build = unpadded.PackedRows.build.__func__  # type: ignore[attr-defined]
    monkeypatch.setattr(
        unpadded.PackedRows,
        "build",
        classmethod(lambda cls, batch, device="cpu", pad_to=None: build(cls, batch, pad_to=pad_to)),
    )
    with DeviceGuard(), pytest.raises(WrongDevice, match="meta"):
        model.run(DEFAULT_LANE, _encoder_payloads(model))


def test_the_guard_catches_token_ids_left_on_the_host(decision_fixture, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    with DeviceGuard():
        model = DecisionFamily().load(decision_fixture("llama"), _context())
    # the model places its token ids where it says it is: on the host, its weights on the device
    monkeypatch.setattr(DecoderLM, "device", property(lambda self: torch.device("cpu")))
    with DeviceGuard(), pytest.raises(WrongDevice):
        model.run(DEFAULT_LANE, [QuestionRow((3, 4, 5), (0, 1))])


@pytest.mark.parametrize("family", ["encoder", "decision"])
def test_a_dtype_the_device_cannot_run_is_refused_at_load(encoder_fixture, decision_fixture, family: str) -> None:  # type: ignore[no-untyped-def]
    mps = FakeDevice(kind="mps", native_dtypes=frozenset({"float32", "float16"}))
    folder: Path = encoder_fixture("embed") if family == "encoder" else decision_fixture("llama")
    loader = EncoderFamily() if family == "encoder" else DecisionFamily()
    with pytest.raises(ValueError, match="no bfloat16 kernels") as refused:
        loader.load(folder, _context(mps, "bfloat16"))
    assert "\n" not in str(refused.value)
    model: LoadedModel = loader.load(folder, _context(mps, "float16"))  # MPS computes float16
    assert model.dtype == "float16"
