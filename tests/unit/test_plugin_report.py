"""`vllm-srun plugins`: each installed family and engine as its card says it, with what it offers;
a plugin that cannot be loaded is listed with why, and the others still are."""

from __future__ import annotations

from importlib.metadata import EntryPoint

from tests.fake_family import FakeEnginePlugin, FakeFamily
from tests.fakes import FakeDevice
from vllm_srun.adapters.engines.plugins import OnnxRuntimePlugin
from vllm_srun.adapters.engines.registry import EngineRegistry
from vllm_srun.adapters.families.registry import FamilyRegistry
from vllm_srun.adapters.plugin_report import plugin_report
from vllm_srun.adapters.plugins import ENGINES_GROUP, FAMILIES_GROUP, PluginInfo

FAKE_FAMILY = PluginInfo(FAMILIES_GROUP, "fake", "fake-srun-plugin", "1.0")
FAKE_ENGINE = PluginInfo(ENGINES_GROUP, "fake", "fake-srun-plugin", "1.0")
ORT = PluginInfo(ENGINES_GROUP, "onnxruntime", "vllm-srun", "0.1.0")


def test_families_engines_and_profiles() -> None:
    broken = EntryPoint(name="broken", value="no_such_module_anywhere:Family", group=FAMILIES_GROUP)
    families = FamilyRegistry(entries=[broken], families={"fake": (FAKE_FAMILY, FakeFamily())})
    engines = EngineRegistry(
        entries=[], engines={"fake": (FAKE_ENGINE, FakeEnginePlugin()), "onnxruntime": (ORT, OnnxRuntimePlugin())}
    )
    got = plugin_report(families, engines, [FakeDevice()])
    by_name = {entry["name"]: entry for entry in got["families"]}
    assert by_name["fake"] == {
        "group": FAMILIES_GROUP,
        "name": "fake",
        "distribution": "fake-srun-plugin",
        "version": "1.0",
        "capabilities": {"options": [], "fixture_variants": ["all"]},
    }
    assert "cannot be loaded" in by_name["broken"]["error"] and "capabilities" not in by_name["broken"]
    fake, ort = got["engines"]
    assert fake["capabilities"] == {
        "dtypes": ["auto", "float32", "bfloat16", "float16"],  # it refuses nothing whatever the model
        "deterministic": True,
        "devices": {FakeDevice().name: None},
    }
    assert ort["capabilities"]["dtypes"] == ["auto"] and ort["capabilities"]["deterministic"] is False
    assert [profile["name"] for profile in got["profiles"]] == ["exact", "shared_context", "batching", "max_speed"]
