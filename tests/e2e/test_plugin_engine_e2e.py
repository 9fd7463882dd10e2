"""Engines of another distribution, end to end on real processes (issue 22 item 4): with the test
plugin distribution installed (`tests/plugin_dist.py`: the fake family and engine, and `acme`, an
encoder engine wrapping the native one), `vllm-srun serve --engine acme` serves our encoder
family on `acme`, a models file served with `--engine fake` and a front whose deployment says
`engine: fake` answer requests, the help texts list the installed engines, and an unknown name or
a setting the plugin refuses is refused in one line before anything loads."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.e2e.front import running_front
from tests.e2e.server import running_server
from tests.integration.test_fake_family import registries
from tests.plugin_dist import FAKE_PLUGINS, plugin_env, write_distribution
from tests.stores import session_store
from vllm_srun.adapters.models.reference_encoder import ReferenceEncoder
from vllm_srun.adapters.models.tokenization import TextTokenizer
from vllm_srun.app.fixtures import write_fixture

pytestmark = pytest.mark.slow
DISTRIBUTION = ("fake-srun-plugin", "1.0")
INSTALLED = {"native", "onnxruntime", "fake", "acme"}


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    """The fake family's package, and the environment of a process that has the test plugin
    distribution installed."""
    root = tmp_path_factory.mktemp("plugin-engine")
    families, engines = registries()
    package = write_fixture(
        root / "tiny-fake", "fake", "all", 0, families=families, engines=engines, store=session_store()
    )
    site = root / "site"
    write_distribution(site, *DISTRIBUTION, FAKE_PLUGINS)
    yield package, plugin_env(site)


def run_cli(module: str, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=120, env=env)


def one_line_refusal(done: subprocess.CompletedProcess[str]) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    return lines[0]


def installed_in(line: str) -> set[str]:
    """The names a refusal's `installed are a, b, c (or auto)` lists."""
    listed = line.split("installed are ", 1)[1].removesuffix(" (or auto)")
    return set(listed.split(", "))


def test_a_worker_serves_our_encoder_on_the_plugin_engine(
    plugin_site: tuple[Path, dict[str, str]],
    encoder_fixture,  # type: ignore[no-untyped-def]
) -> None:
    _, env = plugin_site
    folder = encoder_fixture("embed")
    with running_server(str(folder), "--engine", "acme", env=env) as base:
        card = httpx.get(f"{base}/v1/models").json()["data"][0]
        assert card["engine"] == "acme" and card["acme"] == {"wraps": "native"}
        assert card["golden"]["status"] == "matched"
        assert ("vllm_srun.engines", "acme", *DISTRIBUTION) in {
            (p["group"], p["name"], p["distribution"], p["version"]) for p in card["plugins"]
        }
        texts = ["the cat sat on the mat", "a quick brown fox"]
        r = httpx.post(f"{base}/v1/embeddings", json={"model": "tiny-embed", "input": texts}, timeout=30)
        assert r.status_code == 200, r.text
    want = ReferenceEncoder.from_folder(folder).embed(TextTokenizer.from_folder(folder).encode(texts))
    assert np.abs(np.array([d["embedding"] for d in r.json()["data"]]) - want).max() <= 1e-4


def test_a_models_file_is_served_on_the_engine_the_worker_names(
    plugin_site: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    package, env = plugin_site
    models = tmp_path / "models.yaml"
    models.write_text(f"models:\n  - artifact: {package}\n    name: fake-a\n", encoding="utf-8")
    with running_server("--models", str(models), "--engine", "fake", env=env) as base:
        card = httpx.get(f"{base}/v1/models").json()["data"][0]
        assert card["id"] == "fake-a" and card["engine"] == "fake"
        r = httpx.post(f"{base}/v1/embeddings", json={"model": "fake-a", "input": ["the cat"]}, timeout=30)
        assert r.status_code == 200 and len(r.json()["data"][0]["embedding"]) == 8


def test_the_front_serves_a_deployment_on_the_plugin_engine(
    plugin_site: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    package, env = plugin_site
    config = tmp_path / "front.yaml"
    config.write_text(
        "global:\n  model_catalog:\n    deployments:\n      primary:\n"
        f"        artifact: {package}\n        engine: fake\n        device: cpu\n",
        encoding="utf-8",
    )
    shown = run_cli("vllm_srun.app.front_cli", ["config", "show", "--config", str(config)], env)
    assert shown.returncode == 0 and "engine: fake" in shown.stdout, shown.stderr
    with running_front("--config", str(config), env=env) as front:
        card = httpx.get(f"{front.base}/v1/models").json()["data"][0]
        assert card["engine"] == "fake"
        r = httpx.post(f"{front.base}/v1/embeddings", json={"model": "tiny-fake", "input": ["a red bird"]})
        assert r.status_code == 200, r.text


def test_the_help_texts_list_the_installed_engines(plugin_site: tuple[Path, dict[str, str]]) -> None:
    _, env = plugin_site
    for module in ("vllm_srun.app.cli", "vllm_srun.app.front_cli"):
        done = run_cli(module, ["serve", "--help"], env)
        text = " ".join(done.stdout.split())
        assert done.returncode == 0 and "or an installed engine: " in text, done.stderr
        listed = text.split("or an installed engine: ", 1)[1].split(" (default", 1)[0].split(";", 1)[0]
        assert set(listed.split(", ")) == INSTALLED, text


def test_unknown_engines_and_refused_settings_are_one_line_before_any_load(
    plugin_site: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    package, env = plugin_site
    line = one_line_refusal(run_cli("vllm_srun.app.cli", ["serve", str(package), "--engine", "turbo"], env))
    assert line.startswith("vllm-srun serve: error: argument --engine: unknown engine 'turbo': installed are ")
    assert installed_in(line) == INSTALLED

    config = tmp_path / "turbo.yaml"
    config.write_text(
        f"global:\n  model_catalog:\n    deployments:\n      primary:\n        artifact: {package}\n"
        "        engine: turbo\n",
        encoding="utf-8",
    )
    line = one_line_refusal(run_cli("vllm_srun.app.front_cli", ["config", "show", "--config", str(config)], env))
    assert line.startswith("vllm-sr: error: deployments.primary.engine: unknown engine 'turbo': installed are ")
    assert installed_in(line) == INSTALLED

    line = one_line_refusal(run_cli("vllm_srun.app.cli", ["serve", "x", "--engine", "acme", "--deterministic"], env))
    assert line == "vllm-srun: error: --deterministic: the acme engine promises no bit-identical answers"

    models = tmp_path / "models.yaml"
    models.write_text("models:\n  - artifact: x\n    dtype: bfloat16\n", encoding="utf-8")
    line = one_line_refusal(run_cli("vllm_srun.app.cli", ["serve", "--models", str(models), "--engine", "acme"], env))
    assert (
        line
        == f"vllm-srun: error: {models}: models[0].dtype: the acme engine runs float32 only (dtype auto or float32)"
    )
