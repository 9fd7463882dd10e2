"""R-PKG-3: fixture packages are deterministic by seed, in Hugging Face layout, with a manifest;
other families plug in their own writers."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.stores import session_store
from vllm_srun.adapters.contracts import Family, LoadContext, LoadedModel, PackageInfo
from vllm_srun.adapters.families.registry import FamilyRegistry
from vllm_srun.adapters.plugins import PluginInfo
from vllm_srun.app.fixtures import write_fixture


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_same_seed_same_bytes_other_seed_other_weights(tmp_path: Path) -> None:
    a = write_fixture(tmp_path / "a", "encoder", "classify", 3, golden=False)
    b = write_fixture(tmp_path / "b", "encoder", "classify", 3, golden=False)
    c = write_fixture(tmp_path / "c", "encoder", "classify", 4, golden=False)
    assert _files(a) == _files(b)
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()


def test_golden_recording_is_deterministic(tmp_path: Path, encoder_fixture) -> None:  # type: ignore[no-untyped-def]
    # the session's engine cache, as the session fixture's recording: a kernel plan chosen from the
    # same timings (the user's store is never written by a test)
    again = write_fixture(tmp_path / "tiny-rerank", "encoder", "rerank", 0, store=session_store())
    first = json.loads((encoder_fixture("rerank") / "golden.json").read_text())
    second = json.loads((again / "golden.json").read_text())
    assert (
        first == second and first["references"][0]["device"] == "cpu" and first["references"][0]["dtype"] == "float32"
    )


@pytest.mark.parametrize(
    ("variant", "surfaces", "labels"),
    [
        ("embed", ["embeddings"], None),
        ("classify", ["classify"], 3),
        ("multilabel", ["classify"], 3),
        ("rerank", ["rerank"], 1),
    ],
)
def test_layout_and_manifest(tmp_path: Path, variant: str, surfaces: list[str], labels: int | None) -> None:
    out = write_fixture(tmp_path / variant, "encoder", variant, 0, golden=False)
    config = json.loads((out / "config.json").read_text())
    manifest = json.loads((out / "srun.json").read_text())
    assert manifest["family"] == "encoder" and manifest["surfaces"] == surfaces and manifest["dtype"] == "float32"
    assert manifest["max_input_tokens"] == 128 and FamilyRegistry().family_for(out).name == "encoder"
    assert (out / "tokenizer.json").exists() and (out / "model.safetensors").exists()
    assert config.get("num_labels") == labels
    assert (config.get("problem_type") == "multi_label_classification") is (variant == "multilabel")
    assert (out / "modules.json").exists() is (variant == "embed")
    assert (out / "1_Pooling" / "config.json").exists() is (variant == "embed")


def test_refusals_and_other_families(tmp_path: Path) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    for args in (("full", "encoder", "embed"), ("new", "no-such-family", None), ("new2", "encoder", "nope")):
        with pytest.raises(ValueError):
            write_fixture(tmp_path / args[0], args[1], args[2], 0, golden=False)

    class Toy(Family):
        """A family of another distribution that writes its own fixtures."""

        name = "toy"
        fixture_variants = ("only",)

        def detect(self, folder: Path) -> bool:
            return False

        def describe(self, folder: Path) -> PackageInfo:
            return PackageInfo("toy", frozenset())

        def load(self, folder: Path, context: LoadContext) -> LoadedModel:
            raise ValueError("toy packages are not served")

        def write_fixture(self, out: Path, variant: str | None, seed: int) -> list[dict]:  # type: ignore[type-arg]
            (out / "toy.txt").write_text(f"{variant}-{seed}")
            return []

    families = FamilyRegistry(families={"toy": (PluginInfo("vllm_srun.families", "toy", "toy-dist", "1.0"), Toy())})
    out = write_fixture(tmp_path / "toy", "toy", "only", 5, golden=False, families=families)
    assert (out / "toy.txt").read_text() == "only-5"
    assert sorted(families.names()) == ["audio", "decision", "encoder", "multimodal", "toy"]


@pytest.mark.parametrize("variant", ["clip", "siglip"])
def test_multimodal_fixtures_are_deterministic_and_detected(
    tmp_path: Path, variant: str, multimodal_fixture: Callable[..., Path]
) -> None:
    a = write_fixture(tmp_path / "a", "multimodal", variant, 3, golden=False)
    b = write_fixture(tmp_path / "b", "multimodal", variant, 3, golden=False)
    c = write_fixture(tmp_path / "c", "multimodal", variant, 4, golden=False)
    assert _files(a) == _files(b)
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "preprocessor_config.json", "srun.json"):
        assert (a / name).exists(), name
    assert FamilyRegistry().family_for(a).name == "multimodal"
    (a / "srun.json").unlink()  # detected from config.json's model_type alone
    assert FamilyRegistry().family_for(a).name == "multimodal"
    # the golden file, media data URLs included, is the same every time it is recorded
    again = write_fixture(tmp_path / f"tiny-{variant}", "multimodal", variant, 0, store=session_store())
    recorded = json.loads((multimodal_fixture(variant) / "golden.json").read_text())
    assert json.loads((again / "golden.json").read_text()) == recorded
    kinds = {item["type"] for r in recorded["requests"] for item in r["body"]["input"] if isinstance(item, dict)}
    assert kinds == {"text", "image_url", "video_url"}
