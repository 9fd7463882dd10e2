"""`vllm-srun serve ORG/NAME` as a user with a Hugging Face cache meets it (R-PKG-5): the cache is
laid out by huggingface_hub itself, downloading from a local server that mimics the Hub
(`tests/hub_server.py`); the server is then gone, and `--offline` serves from the cache alone, by
the default branch, a tag (`--revision`, `@REV`) or a commit, with the card naming the repository
and the 40-hex commit. Refusals (a revision twice, `--revision` with several models or for a
folder, a repository not in the cache) are one line, exit status 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.e2e.server import running_server
from tests.hub_server import FakeHub, FakeRepo, serving
from tests.stores import subprocess_env
from vllm_srun.adapters.devices.torch_devices import gpu_possible
from vllm_srun.adapters.hub import HubCache, HubRef

pytestmark = pytest.mark.slow

COMMIT = "89abcdef0123456789abcdef0123456789abcdef"


@pytest.fixture(scope="module")
def hf_cache(encoder_fixture, tmp_path_factory: pytest.TempPathFactory) -> Path:  # type: ignore[no-untyped-def]
    """A Hugging Face cache holding acme/tiny-embed at its default branch and tag v1.0, written by
    a download (huggingface_hub's own layout: blobs, snapshots, refs)."""
    folder = Path(encoder_fixture("embed"))
    files = {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    hub = FakeHub({"acme/tiny-embed": FakeRepo(files, COMMIT, refs={"main": COMMIT, "v1.0": COMMIT})})
    cache = tmp_path_factory.mktemp("hf") / "hub"
    with serving(hub) as endpoint:
        for revision in (None, "v1.0"):
            HubCache(cache, endpoint=endpoint).resolve(HubRef("acme/tiny-embed", revision), lambda _line: None)
    return cache


def serve_refused(*argv: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "vllm_srun.app.cli", "serve", *argv, "--port", "9"],
        capture_output=True,
        text=True,
        timeout=120,
        env=subprocess_env(env),
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


def test_a_hub_id_serves_offline_from_the_cache(hf_cache: Path) -> None:
    # HF_ENDPOINT points nowhere: were anything fetched, the start would fail
    env = {"HF_ENDPOINT": "http://127.0.0.1:9"}
    with running_server("acme/tiny-embed", "--offline", "--cache-dir", str(hf_cache), env=env) as base:
        card = httpx.get(f"{base}/v1/models").json()["data"][0]
        assert (card["id"], card["repo"], card["revision"]) == ("tiny-embed", "acme/tiny-embed", COMMIT)
        assert card["artifact"] == "acme/tiny-embed" and card["golden"]["status"] == "matched"
        answer = httpx.post(f"{base}/v1/embeddings", json={"model": "acme/tiny-embed", "input": "hello"})
        assert answer.status_code == 200, answer.text  # the Hub id is an alias of the served name


def test_a_tag_with_a_served_name_through_the_environment(hf_cache: Path) -> None:
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hf_cache), "HF_ENDPOINT": "http://127.0.0.1:9"}
    with running_server("acme/tiny-embed", "--revision", "v1.0", "--served-model-name", "embedder", env=env) as base:
        card = httpx.get(f"{base}/v1/models").json()["data"][0]
        assert (card["id"], card["repo"], card["revision"]) == ("embedder", "acme/tiny-embed", COMMIT)
        assert httpx.post(f"{base}/v1/embeddings", json={"model": "embedder", "input": "hi"}).status_code == 200


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["acme/tiny-embed@v1.0", "--revision", "main"], "acme/tiny-embed@v1.0 names revision v1.0 and --revision"),
        (["acme/a", "acme/b", "--revision", "main"], "--revision applies to one MODEL argument (2 given)"),
        (["a", "b", "--served-model-name", "x"], "--served-model-name applies to one MODEL argument (2 given)"),
        (["--revision", "main"], "--revision applies to a Hugging Face id MODEL (ORG/NAME); none is given"),
        (["acme/not-cached"], "acme/not-cached is not in the Hugging Face cache"),
        (["acme/tiny-embed@no-such-tag"], "acme/tiny-embed@no-such-tag is not in the Hugging Face cache"),
        (["acme/tiny-embed", "--family", "decision"], "the decision family cannot read this package"),
        (["acme/tiny-embed", "--family", "nope"], "family 'nope' is not installed"),
        (["acme/tiny-embed", "--memory-budget", "0.00001"], "over its memory budget of 1e-05 GiB"),
        (["acme/tiny-embed", "--model", "x"], "unrecognized arguments: --model x (did you mean --models?)"),
    ],
)
def test_refusals_are_one_line(hf_cache: Path, argv: list[str], line: str) -> None:
    env = {"HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}
    got = serve_refused(*argv, "--cache-dir", str(hf_cache), env=env)
    assert line in got, got


def test_a_revision_for_a_folder_is_refused(encoder_fixture) -> None:  # type: ignore[no-untyped-def]
    got = serve_refused(str(encoder_fixture("embed")), "--revision", "main")
    assert "is not a Hugging Face id (ORG/NAME); a local folder, a store or built-in name has no Hub revision" in got


def test_the_listing_commands() -> None:
    def run(*argv: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "vllm_srun.app.cli", *argv],
            capture_output=True,
            text=True,
            timeout=120,
            env=subprocess_env(),
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    table = run("models")
    assert table.splitlines()[0].split()[:4] == ["NAME", "FAMILY", "SIZE", "REPO"]
    assert "sentence-transformers/all-MiniLM-L6-v2" in table and "HuggingFaceTB/SmolLM2-135M-Instruct" in table
    listed = json.loads(run("models", "--json"))
    assert {row["name"] for row in listed} == {"all-MiniLM-L6-v2", "SmolLM2-135M-Instruct"}
    plugins = json.loads(run("plugins"))
    assert {"encoder", "decision"} <= {f["name"] for f in plugins["families"]}
    native = next(e for e in plugins["engines"] if e["name"] == "native")
    assert native["distribution"] == "vllm-srun" and native["capabilities"]["devices"]["cpu"] is None
    devices = json.loads(run("devices"))
    assert devices["devices"][0]["name"] == "cpu" and devices["auto"] in {d["name"] for d in devices["devices"]}
    if not gpu_possible():  # no GPU driver here: auto is the CPU, as `serve` takes it (test_devices_e2e.py)
        assert devices["auto"] == "cpu" and len(devices["devices"]) == 1
