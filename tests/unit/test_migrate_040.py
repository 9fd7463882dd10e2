"""`vllm-sr config migrate` against the released vllm-sr 0.4.0 (issue 27 item 1): the wheel is
downloaded with pip (skipped only when the index cannot be reached), its router-config schema
names the deployment fields, its own semantic check (`_deployment_error` of
cli/validator_model_runtime.py, read from the wheel, not copied) says which combinations 0.4.0
accepts, and every accepted one must migrate, say what it did per field, and load here."""

from __future__ import annotations

import ast
import itertools
import json
import subprocess
import sys
import zipfile
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from vllm_srun.adapters.config.loader import load_config_data
from vllm_srun.adapters.config.migrate import MigrationError, migrate_config_data

SCHEMA = "cli/config_schema/router-config-v0.3.schema.json"
VALIDATOR = "cli/validator_model_runtime.py"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    folder = tmp_path_factory.mktemp("vllm-sr-0.4.0")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "vllm-sr==0.4.0", "--no-deps", "-d", str(folder)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    found = sorted(folder.glob("vllm_sr-0.4.0-*.whl"))
    if done.returncode != 0 or not found:
        pytest.skip(f"pip cannot fetch vllm-sr==0.4.0 from the package index: {done.stderr.strip()[-200:]}")
    return zipfile.ZipFile(found[0])


@pytest.fixture(scope="module")
def schema(wheel: zipfile.ZipFile) -> dict[str, Any]:
    return json.loads(wheel.read(SCHEMA))


@pytest.fixture(scope="module")
def accepts(wheel: zipfile.ZipFile) -> Any:
    """0.4.0's own deployment check: (name, deployment, external names) → None when accepted."""
    tree = ast.parse(wheel.read(VALIDATOR).decode())
    keep = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_deployment_error"]
    keep += [n for n in tree.body if isinstance(n, ast.Assign)]  # DEVICE_SELECTOR_PARTS
    namespace: dict[str, Any] = {"PurePosixPath": PurePosixPath}
    exec(compile(ast.Module(body=keep, type_ignores=[]), VALIDATOR, "exec"), namespace)
    return namespace["_deployment_error"]


def config_of(deployments: dict[str, Any], external: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    catalog: dict[str, Any] = {"deployments": deployments}
    if external is not None:
        catalog["external"] = external
    return {"version": "v0.3", "global": {"model_catalog": catalog}}


def test_our_migration_knows_every_field_of_the_040_deployment(schema: dict[str, Any]) -> None:
    fields = set(schema["$defs"]["ModelDeployment"]["properties"])
    assert fields == {
        "artifact",
        "revision",
        "external_model",
        "provider",
        "device",
        "precision",
        "custom_ops_profile",
        "compilation_cache_dir",
        "input",
    }, "0.4.0's deployment fields changed: teach migrate.py the new ones"
    assert set(schema["$defs"]["ModelInputBudget"]["properties"]) == {"max_tokens", "overflow"}


def test_the_schemas_default_deployments_migrate_and_load(schema: dict[str, Any]) -> None:
    defaults = schema["$defs"]["CanonicalModelCatalog"]["properties"]["deployments"]["default"]
    migrated, changes = migrate_config_data(config_of(defaults))
    config = load_config_data(migrated)
    hazard = config.deployments["hazard"]
    original = defaults["hazard"]
    assert (hazard.artifact, hazard.revision, hazard.device, hazard.dtype) == (
        original["artifact"],
        original["revision"],
        "cpu",
        "float32",
    )
    assert (hazard.input_max_tokens, hazard.input_overflow) == (
        original["input"]["max_tokens"],
        original["input"]["overflow"],
    )
    for field in original:  # every field is said: mapped, dropped or kept
        assert any(line.startswith(f"deployments.hazard.{field}") for line in changes), field


PROVIDERS = ("candle", "ort", "openvino", "http")
PRECISIONS = (None, "native", "fp32", "fp16", "bf16")
DEVICES = (None, "cpu", "cuda:0", "metal:0", "rocm:1", "migraphx:2", "CPU", "GPU.0", "NPU")
INPUTS = (
    None,
    {"max_tokens": 0, "overflow": "reject"},
    {"max_tokens": 8, "overflow": "truncate"},
    {"max_tokens": 512, "overflow": "window"},
)
EXTRAS = ({}, {"custom_ops_profile": "none"}, {"custom_ops_profile": "ck_flash_attention"})
EXTRAS += ({"compilation_cache_dir": "/var/cache/migraphx"},)
EXTERNAL = [{"name": "guard", "llm_endpoint": {"address": "10.0.0.7", "port": 8100}, "llm_model_name": "m"}]


def every_accepted_deployment(accepts: Any) -> list[dict[str, Any]]:
    found = []
    for provider, precision, device, budget, extra in itertools.product(PROVIDERS, PRECISIONS, DEVICES, INPUTS, EXTRAS):
        d: dict[str, Any] = {"provider": provider, **extra}
        if provider == "http":
            d["external_model"] = "guard"
        else:
            d["artifact"] = "models/tiny"
        d |= {k: v for k, v in (("precision", precision), ("device", device), ("input", budget)) if v is not None}
        if accepts("d", d, {"guard"}) is None:
            found.append(d)
    return found


def test_every_deployment_040_accepts_migrates_says_what_it_did_and_loads(accepts: Any) -> None:
    deployments = every_accepted_deployment(accepts)
    providers = {d["provider"] for d in deployments}
    assert providers == set(PROVIDERS) and len(deployments) > 50  # the oracle is not refusing everything
    for d in deployments:
        migrated, changes = migrate_config_data(config_of({"d": d}, EXTERNAL))
        config = load_config_data(migrated)  # raises when the rewrite does not load here
        out = config.deployments["d"]
        for field in d:
            assert any(line.startswith(f"deployments.d.{field}") for line in changes), (d, field, changes)
        if d["provider"] == "ort":
            assert out.engine == "onnxruntime" and out.dtype in (None, "auto"), d
        if d["provider"] == "http":
            assert out.placement()[0].endpoint == "http://10.0.0.7:8100" and out.placement()[0].model == "m"
        elif d.get("input", {}).get("max_tokens"):
            assert out.input_max_tokens == d["input"]["max_tokens"]
        assert "version" not in yaml.safe_dump(migrated)


def test_ort_fp16_becomes_onnxruntime_at_auto_with_a_note() -> None:
    d = {"provider": "ort", "artifact": "a", "precision": "fp16", "device": "cpu"}
    _, changes = migrate_config_data(config_of({"d": d}))
    line = next(line for line in changes if line.startswith("deployments.d.precision"))
    # a half precision asks for profile max_speed, as upstream's migration writes it (R-PROF-3)
    assert line.startswith(
        "deployments.d.precision: fp16 → dtype: auto, profile: max_speed (approximate) (choice: the onnxruntime engine"
    )


def test_what_cannot_be_expressed_is_refused_naming_the_field() -> None:
    d = {"provider": "http", "external_model": "nowhere"}
    with pytest.raises(MigrationError) as refused:
        migrate_config_data(config_of({"d": d}))
    assert refused.value.problems == [
        "deployments.d.external_model: 'nowhere' names no entry of global.model_catalog.external with an "
        "llm_endpoint address; write the attached runtime as 'endpoint' and 'model' instead"
    ]


def test_fixture_path_is_not_in_our_tree() -> None:
    assert not list(Path(__file__).parents[2].glob("**/router-config-v0.3.schema.json"))
