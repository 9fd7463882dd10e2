"""The contracts, proven by a family that is not ours: the fake family (`tests/fake_family.py`,
no torch) and its engine plug into the worker container by provider overrides, load through
the same runtime, pass the golden check and serve every surface over HTTP."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.fake_family import FakeEnginePlugin, FakeFamily
from tests.fakes import FakeDevice
from tests.integration.serving import container_for, serving
from tests.stores import session_store
from vllm_srun.adapters.engines.plugins import NativePlugin, OnnxRuntimePlugin
from vllm_srun.adapters.engines.registry import EngineRegistry
from vllm_srun.adapters.families.registry import FamilyRegistry
from vllm_srun.adapters.plugins import ENGINES_GROUP, FAMILIES_GROUP, PluginConflict, PluginInfo
from vllm_srun.app.fixtures import write_fixture

FAKE_FAMILY = PluginInfo(FAMILIES_GROUP, "fake", "fake-srun-plugin", "1.0")
FAKE_ENGINE = PluginInfo(ENGINES_GROUP, "fake", "fake-srun-plugin", "1.0")


def registries() -> tuple[FamilyRegistry, EngineRegistry]:
    return (
        FamilyRegistry(families={"fake": (FAKE_FAMILY, FakeFamily())}),
        EngineRegistry(engines={"fake": (FAKE_ENGINE, FakeEnginePlugin())}),
    )


@pytest.fixture(scope="module")
def fake_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    families, engines = registries()
    return write_fixture(
        tmp_path_factory.mktemp("fake") / "tiny-fake",
        "fake",
        "all",
        0,
        families=families,
        engines=engines,
        store=session_store(),
    )


def fake_container(
    package: Path | list[Path],
    device: FakeDevice | None = None,
    adapters: dict[str, Any] | None = None,
    **settings: Any,
) -> Any:
    """A worker of PACKAGE (or of several) built through `bootstrap_worker` with the fake family,
    engine and device."""
    families, engines = registries()
    given = {"families": families, "engines": engines, "device": device or FakeDevice(), **(adapters or {})}
    return container_for(package if isinstance(package, list) else [package], adapters=given, **settings)


def test_every_surface_over_http(fake_package: Path) -> None:
    with serving(fake_container(fake_package)) as (client, _rt):
        card = client.get("/v1/models").json()["data"][0]
        assert card["status"] == "ready" and card["family"] == "fake" and card["engine"] == "fake"
        assert card["golden"]["status"] == "matched" and card["numerics"] == "exact"  # hashed rows: batch-invariant
        assert card["surfaces"] == ["classify", "decisions", "embeddings", "rerank"]
        assert {(p["group"], p["name"], p["distribution"]) for p in card["plugins"]} == {
            (FAMILIES_GROUP, "fake", "fake-srun-plugin"),
            (ENGINES_GROUP, "fake", "fake-srun-plugin"),
        }
        embedded = client.post("/v1/embeddings", json={"input": ["the cat", "a red bird"], "dimensions": 4})
        assert embedded.status_code == 200 and [len(d["embedding"]) for d in embedded.json()["data"]] == [4, 4]
        assert embedded.json()["object"] == "list"  # like the OpenAI API, always said
        classified = client.post("/v1/classify", json={"input": ["help", {"text": "the order", "text_pair": "refund"}]})
        assert classified.status_code == 200 and classified.json()["labels"] == ["calm", "urgent", "spam"]
        for path in ("/v1/rerank", "/v2/rerank"):
            ranked = client.post(path, json={"query": "capital", "documents": ["paris", "dog", "blue"], "top_n": 2})
            assert ranked.status_code == 200 and len(ranked.json()["results"]) == 2
        questions = {
            "good": {"type": "noul", "instructions": "is it good"},
            "team": {"type": "choice", "criteria": {"billing": None, "shipping": None}},
            "stars": {"type": "score", "criteria": ["bad", "good", "great"]},
        }
        answered = client.post("/v1/decisions", json={"state": "the movie was fun", "questions": questions})
        assert answered.status_code == 200 and set(answered.json()["answers"]) == {"good", "team", "stars"}
        one = client.post("/v1/systemone", json={"state": "the movie was fun", "questions": questions})
        assert one.status_code == 200 and one.json()["answers"] == answered.json()["answers"]
        batch = client.post(
            "/v1/systemone/batches",
            json={"states": [{"id": 1, "state": "a"}, {"id": "b", "state": "b"}], "questions": questions},
        )
        assert batch.status_code == 200 and [r["id"] for r in batch.json()["results"]] == [1, "b"]
        assert client.get("/health").status_code == 200 and "vllm_srun_forwards_total" in client.get("/metrics").text


def test_errors_come_from_the_one_table(fake_package: Path) -> None:
    with serving(fake_container(fake_package)) as (client, _):
        bad = client.post("/v1/embeddings", json={"input": []})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_request"
        assert "server-timing" in bad.headers
        missing = client.post("/v1/embeddings", json={"model": "nope", "input": "x"})
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
        route = client.get("/no/such/route")
        assert route.status_code == 404 and route.json()["error"]["code"] == "invalid_request"


def test_batching_limits_come_from_the_device_memory_class(fake_package: Path) -> None:
    """R-DEV-1 through the Device contract: an 80 GB device gets the 64–160 GB row (the calibration
    that follows on GPUs, R-DEV-2, is left out here: tests/integration/test_gpu_limits.py)."""
    device = FakeDevice(kind="cuda", index=0, total=80 * 10**9)
    container = fake_container(fake_package, device=device, adapters={"calibrator": None})
    with serving(container) as (client, _):
        card = client.get("/v1/models").json()["data"][0]
        args = card["engine_args"]
        assert (args["max_num_batched_tokens"], args["max_num_seqs"]) == (16_384, 128)
        assert args["max_num_batched_tokens_source"] == "class" and args["memory_class"] == "64-160GB"
        assert card["device"] == "cuda:0"


def test_a_family_without_a_listed_surface_contract_fails_its_load(fake_package: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in fake_package.iterdir():
        if f.is_file():
            (broken / f.name).write_bytes(f.read_bytes())
    manifest = (broken / "srun.json").read_text().replace('"rerank"', '"rerank", "translate"')
    (broken / "srun.json").write_text(manifest)
    with serving(fake_container(broken)) as (client, _):
        card = client.get("/v1/models").json()["data"][0]
        assert card["status"] == "failed" and "unknown surface 'translate'" in card["reason"]


def test_a_name_claimed_twice_is_refused_naming_both_distributions() -> None:
    clash = {"encoder": (PluginInfo(FAMILIES_GROUP, "encoder", "acme-encoders", "2.0"), FakeFamily())}
    with pytest.raises(PluginConflict) as refused:
        FamilyRegistry(families=clash)
    assert "vllm-srun" in str(refused.value) and "acme-encoders" in str(refused.value)
    assert "\n" not in str(refused.value)


def test_auto_picks_the_first_engine_that_serves_the_kind() -> None:
    engines = EngineRegistry(engines={"fake": (FAKE_ENGINE, FakeEnginePlugin())})
    assert isinstance(engines.plugins.get("native"), NativePlugin)
    assert isinstance(engines.plugins.get("onnxruntime"), OnnxRuntimePlugin)
    assert engines.choices() == ["auto", "native", "onnxruntime", "fake"]


def test_a_built_in_model_missing_from_the_store_is_pulled_at_load(fake_package: Path, tmp_path: Path) -> None:
    """`vllm-srun serve NAME` of a built-in the store lacks pulls it (with progress) instead of
    staying up unhealthy (FakeStore: the pull hands back the fake package)."""
    from tests.fakes import FakeStore
    from vllm_srun.adapters.catalog import DEFAULT_MODEL

    class PullingStore(FakeStore):
        def pull(self, name: str, progress: Any) -> Path:
            progress(f"pull: {name} (fake)")
            self.folders[name] = fake_package
            return super().pull(name, progress)

    store = PullingStore({}, tmp_path, tmp_path / ".engines")
    said: list[str] = []
    container = fake_container(Path(DEFAULT_MODEL), progress=said.append, adapters={"store": store})
    container = container_for(
        [Path(DEFAULT_MODEL), Path("not-built-in")],
        progress=said.append,
        adapters={
            "families": container.families(),
            "engines": container.engines(),
            "device": FakeDevice(),
            "store": store,
        },
    )
    with serving(container) as (client, rt):
        assert store.pulled == [DEFAULT_MODEL]  # a name that is not built in is never pulled
        assert rt.models[DEFAULT_MODEL].status == "ready" and rt.models["not-built-in"].status == "failed"
        assert (
            any("not in the store yet: pulling it" in line for line in said) and f"pull: {DEFAULT_MODEL} (fake)" in said
        )
        r = client.post("/v1/embeddings", json={"model": DEFAULT_MODEL, "input": "the cat"})
        assert r.status_code == 200
