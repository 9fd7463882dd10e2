"""docs/models.md's "Serve a model you already have" runs as written: every `vllm-srun serve`
command of that section, started as the page shows it (only `--port` added), becomes ready and
serves the model it names. The Hugging Face cache under `$HF_HOME` is laid out by
huggingface_hub itself, downloading from a local server that mimics the Hub (`HF_ENDPOINT`,
`tests/hub_server.py`): `BAAI/bge-small-en-v1.5` is cached beforehand, `intfloat/e5-small-v2` is
downloaded by its own command, and the offline commands ask the server nothing. Both hold a tiny
fixture encoder under those names; the built-in name serves the store's real all-MiniLM-L6-v2."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.server import free_port
from tests.hub_server import FakeHub, FakeRepo, serving
from tests.stores import subprocess_env
from vllm_srun.adapters.hub import HubCache, HubRef
from vllm_srun.adapters.model_store import LocalModelStore

pytestmark = pytest.mark.slow

DOC = Path(__file__).resolve().parents[2] / "docs" / "models.md"
COMMIT = "5c38ec7c405ec4b44b94cc5a9bb96e735b38267a"
E5_COMMIT = "ffb93f3bd4047442299a41ebb6fa998a38507c52"


def section() -> str:
    text = DOC.read_text(encoding="utf-8")
    start = text.index("## Serve a model you already have")
    return text[start : text.index("\n## ", start + 3)]


def commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", section(), re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


# what each command serves: (served names, the repo and revision the first card reports)
EXPECTED = {
    "./my-embedder": (["my-embedder"], None, None),
    "BAAI/bge-small-en-v1.5@main --served-model-name bge": (["bge"], "BAAI/bge-small-en-v1.5", COMMIT),
    "--revision": (["bge-small-en-v1.5"], "BAAI/bge-small-en-v1.5", COMMIT),
    "BAAI/bge-small-en-v1.5": (["bge-small-en-v1.5"], "BAAI/bge-small-en-v1.5", COMMIT),
    "intfloat/e5-small-v2": (["e5-small-v2"], "intfloat/e5-small-v2", E5_COMMIT),
    "serve my-embedder": (["my-embedder"], None, None),
    "all-MiniLM-L6-v2": (["all-MiniLM-L6-v2"], "sentence-transformers/all-MiniLM-L6-v2", None),
    "--models models.yaml": (["bge", "minilm"], "BAAI/bge-small-en-v1.5", COMMIT),
}


def expected(command: str) -> tuple[list[str], str | None, str | None]:
    return next(value for key, value in EXPECTED.items() if key in command)


def test_the_section_shows_one_command_per_way() -> None:
    found = commands()
    assert len(found) == 10 and all(c.split("vllm-srun ", 1)[1].startswith("serve ") for c in found), found
    assert {id(expected(c)) for c in found} == {id(v) for v in EXPECTED.values()}  # every way is shown


@pytest.fixture(scope="module")
def place(encoder_fixture, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A working folder holding `my-embedder` and the page's models.yaml, a store holding
    `my-embedder` and the real all-MiniLM-L6-v2, and a Hub whose BAAI repo is already cached."""
    root = tmp_path_factory.mktemp("models-doc")
    package = Path(encoder_fixture("embed"))
    shutil.copytree(package, root / "work" / "my-embedder")
    store = root / "store"
    shutil.copytree(package, store / "my-embedder")
    minilm = LocalModelStore.from_env().root / "all-MiniLM-L6-v2"
    if not (minilm / "config.json").is_file():
        pytest.skip("all-MiniLM-L6-v2 is not in the model store (vllm-srun pull all-MiniLM-L6-v2)")
    (store / "all-MiniLM-L6-v2").symlink_to(minilm, target_is_directory=True)
    (root / "work" / "models.yaml").write_text(re.search(r"```yaml\n(.*?)```", section(), re.S)[1])  # type: ignore[index]
    files = {p.relative_to(package).as_posix(): p.read_bytes() for p in package.rglob("*") if p.is_file()}
    hub = FakeHub(
        {
            "BAAI/bge-small-en-v1.5": FakeRepo(files, COMMIT, refs={"main": COMMIT}),
            "intfloat/e5-small-v2": FakeRepo(files, E5_COMMIT, refs={"main": E5_COMMIT}),
        }
    )
    home = root / "hf-home"
    with serving(hub) as endpoint:
        HubCache(home / "hub", endpoint=endpoint).resolve(HubRef("BAAI/bge-small-en-v1.5"), lambda _line: None)
        hub.requests.clear()
        env = {
            "HF_HOME": str(home),
            "HF_HUB_CACHE": str(home / "hub"),  # as HF_HOME says it, whatever the outer environment holds
            "HF_HUB_OFFLINE": "0",
            "HF_ENDPOINT": endpoint,
            "VLLM_SRUN_MODELS": str(store),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",  # `vllm-srun`
            "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        }
        yield root / "work", env, hub


@pytest.mark.parametrize("command", commands())
def test_every_command_serves_what_it_names(command: str, place) -> None:  # type: ignore[no-untyped-def]
    work, env, hub = place
    names, repo, revision = expected(command)
    asked_before = len(hub.requests)
    port = free_port()
    log = work.parent / f"serve-{port}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            ["bash", "-c", f"{command} --port {port} --log-level warning"],
            cwd=work,
            env=subprocess_env(env),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 240
            while True:
                assert proc.poll() is None, log.read_text()[-3000:]
                try:
                    if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.25)
            cards = httpx.get(f"{base}/v1/models").json()["data"]
            assert [card["id"] for card in cards] == names
            assert (cards[0]["repo"], cards[0]["revision"]) == (repo, revision), cards[0]
            answer = httpx.post(f"{base}/v1/embeddings", json={"model": names[0], "input": "hello"}, timeout=60)
            assert answer.status_code == 200, answer.text
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    fetched = hub.requests[asked_before:]
    if "e5-small-v2" in command:
        assert any("/resolve/" in r for r in fetched), fetched  # the one download
    else:
        assert fetched == [], fetched  # from the cache (or a folder, the store): the Hub is never asked
