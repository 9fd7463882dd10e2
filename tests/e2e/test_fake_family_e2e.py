"""A third-party family, end to end on real processes: the fake family and engine
(`tests/fake_family.py`) installed as a distribution of their own (entry points only, no edit
to this package) are served by `vllm-srun serve` and through `vllm-sr serve`, on every surface,
and neither process ever loads torch. A plugin name claimed twice is refused with one line."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.front import running_front
from tests.e2e.server import running_server
from tests.integration.test_fake_family import registries
from tests.plugin_dist import FAKE_PLUGINS, plugin_env, write_distribution
from tests.stores import session_store
from vllm_srun.app.fixtures import write_fixture

pytestmark = pytest.mark.slow
QUESTIONS = {
    "good": {"type": "noul", "instructions": "is it good"},
    "stars": {"type": "score", "criteria": ["bad", "good", "great"]},
}


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    root = tmp_path_factory.mktemp("fake-plugin")
    families, engines = registries()
    package = write_fixture(
        root / "tiny-fake", "fake", "all", 0, families=families, engines=engines, store=session_store()
    )
    site = root / "site"
    write_distribution(site, "fake-srun-plugin", "1.0", FAKE_PLUGINS)
    yield package, plugin_env(site)


def every_surface(base: str, model: str) -> None:
    with httpx.Client(base_url=base, timeout=30) as client:
        checks = [
            client.post("/v1/embeddings", json={"model": model, "input": ["the cat", "a red bird"]}),
            client.post("/v1/classify", json={"model": model, "input": "help with my order"}),
            client.post("/v1/rerank", json={"model": model, "query": "capital", "documents": ["paris", "dog"]}),
            client.post("/v2/rerank", json={"model": model, "query": "capital", "documents": ["paris", "dog"]}),
            client.post("/v1/decisions", json={"model": model, "state": "a fun movie", "questions": QUESTIONS}),
            client.post("/v1/systemone", json={"model": model, "state": "a fun movie", "questions": QUESTIONS}),
            client.post(
                "/v1/systemone/batches",
                json={"model": model, "states": [{"id": "x", "state": "fun"}], "questions": QUESTIONS},
            ),
        ]
        assert [r.status_code for r in checks] == [200] * len(checks), [r.text[:200] for r in checks]
        bad = client.post("/v1/embeddings", json={"model": model, "input": []})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_request"


def torch_mapped(pid: int) -> bool:
    return "libtorch" in Path(f"/proc/{pid}/maps").read_text()


def test_a_worker_serves_the_plugin_family_without_torch(plugin_site: tuple[Path, dict[str, str]]) -> None:
    package, env = plugin_site
    with running_server(str(package), env=env) as base:
        every_surface(base, "tiny-fake")
        card = httpx.get(f"{base}/v1/models").json()["data"][0]
        assert card["family"] == "fake" and card["engine"] == "fake" and card["golden"]["status"] == "matched"
        assert {(p["group"], p["name"], p["distribution"], p["version"]) for p in card["plugins"]} == {
            ("vllm_srun.families", "fake", "fake-srun-plugin", "1.0"),
            ("vllm_srun.engines", "fake", "fake-srun-plugin", "1.0"),
        }
        assert card["fake"]["torch_loaded"] is False


def test_the_front_serves_the_plugin_family_without_torch(plugin_site: tuple[Path, dict[str, str]]) -> None:
    package, env = plugin_site
    with running_front(str(package), env=env) as front:
        every_surface(front.base, "tiny-fake")
        workers = [w for d in front.inventory()["deployments"] for w in d["workers"]]
        assert len(workers) == 1 and workers[0]["state"] == "ready"
        assert not torch_mapped(front.proc.pid) and not torch_mapped(workers[0]["pid"])
        card = httpx.get(f"{front.base}/v1/models").json()["data"][0]
        assert card["family"] == "fake" and card["fake"]["torch_loaded"] is False


def test_a_name_claimed_twice_is_refused_with_one_line(
    plugin_site: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    package, _ = plugin_site
    site = tmp_path / "site"
    write_distribution(
        site, "acme-encoders", "2.0", {"vllm_srun.families": {"encoder": "tests.fake_family:FakeFamily"}}
    )
    done = subprocess.run(
        [sys.executable, "-m", "vllm_srun.app.cli", "serve", str(package)],
        capture_output=True,
        text=True,
        timeout=120,
        env=plugin_env(site),
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "'encoder'" in lines[0] and "vllm-srun" in lines[0] and "acme-encoders 2.0" in lines[0]
