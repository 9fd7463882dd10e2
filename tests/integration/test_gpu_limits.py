"""Batching limits on GPU workers, served in-process on fake GPUs: the memory-class defaults of
every class in the card and `/v1/models` (R-DEV-1), the knee calibration after the golden check
(R-DEV-2) with the scheduler then planning by it and its cost per token seeding R-BAT-7's caps,
a set value never calibrated, `--device auto` resolved through the container, and the one-line
refusals of `check_worker`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from dependency_injector import providers

from tests.fake_family import FakeEnginePlugin, FakeFamily
from tests.fakes import CPU_BUILD, CUDA2, FakeClock, FakeDevice, FakeProbe
from tests.integration.serving import container_for, serving
from tests.stores import session_store
from vllm_srun.adapters.devices.torch_devices import CpuDevice, CudaDevice
from vllm_srun.adapters.engines.registry import EngineRegistry
from vllm_srun.adapters.families.registry import FamilyRegistry
from vllm_srun.adapters.plugins import ENGINES_GROUP, FAMILIES_GROUP, PluginInfo
from vllm_srun.adapters.serving.calibration import KneeCalibrator
from vllm_srun.app.fixtures import write_fixture
from vllm_srun.app.server import check_worker
from vllm_srun.domain.scheduling.rows import DEFAULT_LANE
from vllm_srun.domain.settings.devices import GIB
from vllm_srun.domain.settings.engine_args import EngineArgs

GB = 10**9
FAKE_FAMILY = PluginInfo(FAMILIES_GROUP, "fake", "fake-srun-plugin", "1.0")
FAKE_ENGINE = PluginInfo(ENGINES_GROUP, "fake", "fake-srun-plugin", "1.0")


def _registries() -> tuple[FamilyRegistry, EngineRegistry]:
    return (
        FamilyRegistry(families={"fake": (FAKE_FAMILY, FakeFamily())}),
        EngineRegistry(engines={"fake": (FAKE_ENGINE, FakeEnginePlugin())}),
    )


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    families, engines = _registries()
    root = tmp_path_factory.mktemp("fake-gpu") / "tiny-fake"
    return write_fixture(root, "fake", "all", 0, families=families, engines=engines, store=session_store())


def _container(package: Path, device: FakeDevice, args: EngineArgs | None = None, calibrate: bool = True) -> Any:
    container = container_for([(package, args or EngineArgs())])
    families, engines = _registries()
    container.families.override(providers.Object(families))
    container.engines.override(providers.Object(engines))
    container.device.override(providers.Object(device))
    timer = device.clock.now if device.clock is not None else FakeClock().now
    container.calibrator.override(providers.Object(KneeCalibrator(timer=timer) if calibrate else None))
    return container


def _card(client: Any) -> dict[str, Any]:
    cards = client.get("/v1/models").json()["data"]
    assert len(cards) == 1
    return cards[0]


@pytest.mark.parametrize(
    ("kind", "total", "tokens", "seqs", "memory_class"),
    [
        ("cuda", 192 * GB, 32_768, 256, ">=160GB"),
        ("cuda", 141 * GB, 16_384, 128, "64-160GB"),
        ("rocm", 48 * GB, 8_192, 64, "32-64GB"),
        ("cuda", 16 * GB, 4_096, 32, "<32GB"),
        ("mps", None, 65_536, 8_192, "unreported"),
        ("cpu", None, 65_536, 8_192, "cpu"),
    ],
)
def test_every_memory_class_reaches_the_card(
    package: Path, kind: str, total: int | None, tokens: int, seqs: int, memory_class: str
) -> None:
    device = FakeDevice(kind=kind, index=0 if kind in ("cuda", "rocm") else None, total=total)
    with serving(_container(package, device, calibrate=False)) as (client, rt):
        card = _card(client)
        args = card["engine_args"]
        assert (args["max_num_batched_tokens"], args["max_num_seqs"], args["memory_class"]) == (
            tokens,
            seqs,
            memory_class,
        )
        assert args["max_num_batched_tokens_source"] == args["max_num_seqs_source"] == "class"
        assert card["device"] == device.name and card["ready"] and args["calibration"] is None
        budget = rt.models["tiny-fake"].scheduler_loop.scheduler.budget  # type: ignore[union-attr]
        assert (budget.max_num_batched_tokens, budget.max_num_seqs) == (tokens, seqs)


def _gpu(cost: Callable[[int], float | None], **kw: Any) -> FakeDevice:
    return FakeDevice(
        kind="cuda", index=0, total=80 * GB, free=60 * GB, cost=cost, clock=FakeClock(), bytes_per_token=4_000, **kw
    )


def test_calibration_keeps_the_knee_and_the_scheduler_plans_by_it(package: Path) -> None:
    """A cliff past 8,192 tokens (the cost per token doubles): the knee is 8,192."""
    device = _gpu(lambda t: 1e-6 * t if t <= 8_192 else 2e-6 * t)
    with serving(_container(package, device)) as (client, rt):
        card = _card(client)
        args, calibration = card["engine_args"], card["engine_args"]["calibration"]
        assert card["ready"] and card["golden"]["status"] == "matched"  # calibrated after the golden check
        assert (args["max_num_batched_tokens"], args["max_num_batched_tokens_source"]) == (8_192, "calibrated")
        assert (args["max_num_seqs"], args["max_num_seqs_source"], args["memory_class"]) == (128, "class", "64-160GB")
        assert calibration["status"] == "calibrated" and calibration["limited_by"] == "knee"
        # 128 rows of the fake family's 96 tokens fill at most 12,288: the largest size timed
        assert [t["tokens"] for t in calibration["timings"]] == [4_096, 8_192, 12_288]
        assert calibration["timings"][1]["peak_bytes"] == 8_192 * 4_000 and calibration["free_bytes"] == 60 * GB
        scheduler = rt.models["tiny-fake"].scheduler_loop.scheduler  # type: ignore[union-attr]
        assert scheduler.budget.max_num_batched_tokens == 8_192
        assert scheduler.costs.seconds_per_token(DEFAULT_LANE) == pytest.approx(1e-6)  # seeds R-BAT-7's caps
        calibrated = len(device.forwards)
        texts = [" ".join(["the cat is red and blue"] * 15)] * 120  # 120 rows of 96 tokens: 11,520 tokens
        r = client.post("/v1/embeddings", json={"input": texts})
        assert r.status_code == 200 and len(r.json()["data"]) == 120
        served = device.forwards[calibrated:]
        assert max(served) <= 8_192 and sum(served) >= 11_520  # cut by the calibrated budget


def test_a_set_budget_is_never_calibrated(package: Path) -> None:
    device = _gpu(lambda t: 1e-6 * t)
    with serving(_container(package, device, EngineArgs(max_num_batched_tokens=2_048))) as (client, _):
        args = _card(client)["engine_args"]
        assert (args["max_num_batched_tokens"], args["max_num_batched_tokens_source"]) == (2_048, "set")
        assert args["calibration"] == {"status": "skipped", "reason": "max_num_batched_tokens is set"}
        assert 4_096 not in device.forwards  # no calibration forward ran


def test_out_of_memory_bounds_the_calibrated_budget(package: Path) -> None:
    device = _gpu(lambda t: None if t > 6_000 else 1e-3 + 1e-7 * t)
    with serving(_container(package, device)) as (client, _):
        args = _card(client)["engine_args"]
        assert args["max_num_batched_tokens"] == 4_096 and args["calibration"]["out_of_memory_at"] == 8_192
    nothing = _gpu(lambda t: None if t >= 4_096 else 1e-3)  # serves small forwards, none of the sizes timed
    with serving(_container(package, nothing)) as (client, _):
        card = _card(client)
        args = card["engine_args"]
        assert card["ready"] and (args["max_num_batched_tokens"], args["max_num_batched_tokens_source"]) == (
            16_384,
            "class",
        )
        assert args["calibration"]["status"] == "failed" and "out of memory" in args["calibration"]["reason"]


def test_auto_resolves_through_the_container_and_refusals_are_one_line(package: Path) -> None:
    container = container_for([package], device="auto")
    container.device_probe.override(
        providers.Object(FakeProbe(CUDA2, {0: (1 * GIB, 80 * GIB), 1: (70 * GIB, 80 * GIB)}))
    )
    assert container.device() == CudaDevice(1)
    cpu_only = container_for([(package, EngineArgs(dtype="float16"))], device="auto")
    cpu_only.device_probe.override(providers.Object(FakeProbe(CPU_BUILD)))
    with pytest.raises(ValueError, match=r"^--dtype float16 runs on GPUs only \(device cpu\)"):
        check_worker(cpu_only)
    assert cpu_only.device() == CpuDevice()
    missing = container_for([package], device="cuda:3")
    missing.device_probe.override(providers.Object(FakeProbe(CUDA2)))
    with pytest.raises(ValueError, match="GPU index out of range; this process sees 2 GPU"):
        check_worker(missing)
    mps = container_for([(package, EngineArgs(dtype="bfloat16"))], device="mps", engine="native")
    mps.device.override(providers.Object(FakeDevice(kind="mps", native_dtypes=frozenset({"float32", "float16"}))))
    with pytest.raises(ValueError, match="device mps has no bfloat16 kernels"):
        check_worker(mps)
    mps_ort = container_for([package], device="mps", engine="onnxruntime")
    mps_ort.device.override(providers.Object(FakeDevice(kind="mps", native_dtypes=frozenset({"float32"}))))
    with pytest.raises(ValueError, match="the onnxruntime engine has no execution provider for mps devices"):
        check_worker(mps_ort)


def test_a_calibration_that_breaks_leaves_the_class_budget_and_says_why(package: Path) -> None:
    def cost(tokens: int) -> float:
        if tokens >= 4_096:
            raise RuntimeError("injected kernel fault")
        return 1e-3

    with serving(_container(package, _gpu(cost))) as (client, _):
        card = _card(client)
        args = card["engine_args"]
        assert card["ready"] and (args["max_num_batched_tokens"], args["max_num_batched_tokens_source"]) == (
            16_384,
            "class",
        )
        assert args["calibration"] == {"status": "failed", "reason": "RuntimeError: injected kernel fault"}
        assert client.post("/v1/embeddings", json={"input": "still served"}).status_code == 200
