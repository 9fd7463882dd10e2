"""ONNX Runtime's rules live in its plugin (issue 22 item 4): a worker built in code (no CLI in
front) asks the engine plugin what it refuses before anything loads (`check_worker`), and the
plugin refuses to build on an encoder that does not compute in float32, so no path serves a dtype
it does not run. The CLI and config side is `tests/unit/test_engine_names.py`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.integration.serving import container_for, serving
from vllm_srun.adapters.contracts import EngineRefused, EngineRequest, quiet
from vllm_srun.adapters.devices.torch_devices import CpuDevice
from vllm_srun.adapters.engines.registry import EngineRegistry
from vllm_srun.adapters.models.reference_encoder import ReferenceEncoder
from vllm_srun.app.server import check_worker
from vllm_srun.domain.settings.engine_args import EngineArgs


def test_the_onnxruntime_engine_builds_only_on_a_float32_encoder(encoder_fixture, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    reference = ReferenceEncoder.from_folder(encoder_fixture("embed"), dtype=torch.bfloat16)
    request = EngineRequest("encoder", reference, CpuDevice(), cache_dir=tmp_path)
    with pytest.raises(EngineRefused) as refused:
        EngineRegistry().build("onnxruntime", request, quiet)
    assert str(refused.value) == "the onnxruntime engine runs only dtype auto (this encoder computes in bfloat16)"
    assert not list(tmp_path.iterdir())  # refused before anything was exported


@pytest.mark.parametrize(
    ("args", "settings", "line"),
    [
        (EngineArgs(dtype="bfloat16"), {}, "--dtype bfloat16: the onnxruntime engine runs only dtype auto"),
        (EngineArgs(dtype="float32"), {}, "--dtype float32: the onnxruntime engine runs only dtype auto"),
        (
            EngineArgs(),
            {"deterministic": True},
            "--deterministic: the onnxruntime engine cannot answer bit-identically in any batch; use --engine native",
        ),
    ],
)
def test_a_worker_asks_the_engine_plugin_before_anything_loads(
    encoder_fixture,  # type: ignore[no-untyped-def]
    args: EngineArgs,
    settings: dict[str, object],
    line: str,
) -> None:
    container = container_for([(encoder_fixture("embed"), args)], engine="onnxruntime", **settings)
    with pytest.raises(ValueError) as refused:
        check_worker(container)
    assert str(refused.value) == line


def test_a_worker_that_skips_the_checks_fails_the_model_with_the_plugins_reason(encoder_fixture) -> None:  # type: ignore[no-untyped-def]
    with serving([(encoder_fixture("embed"), EngineArgs(dtype="bfloat16"))], engine="onnxruntime") as (client, _):
        card = client.get("/v1/models").json()["data"][0]
    assert card["status"] == "failed" and "the onnxruntime engine runs only dtype auto" in card["reason"]
