"""Hub ids through the Hugging Face cache and a Hub download (R-PKG-5), with no Internet.

The cache is laid out by huggingface_hub itself (a download from `tests/hub_server.py`, a local
server that mimics the Hub's endpoints), and our resolution is checked against
`huggingface_hub.snapshot_download(local_files_only=True)` on the same cache.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.hub_server import FakeHub, FakeRepo, serving
from vllm_srun.adapters.hub import IGNORED_FILES, HubCache, HubRef, hub_origin, parse_hub_id
from vllm_srun.adapters.model_store import LocalModelStore
from vllm_srun.domain.errors import ModelNotFound

COMMIT = "0123456789abcdef0123456789abcdef01234567"
OLDER = "fedcba9876543210fedcba9876543210fedcba98"


def _package(encoder_fixture) -> dict[str, bytes]:  # type: ignore[no-untyped-def]
    folder = Path(encoder_fixture("embed"))
    files = {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    files["pytorch_model.bin"] = b"weights of another framework: never downloaded"
    return files


@pytest.fixture
def hub(encoder_fixture) -> FakeHub:  # type: ignore[no-untyped-def]
    files = _package(encoder_fixture)
    older = dict(files, **{"config.json": json.dumps({**json.loads(files["config.json"]), "_older": True}).encode()})
    return FakeHub(
        {
            "acme/tiny-embed": FakeRepo(files, COMMIT, refs={"main": COMMIT, "v1.0": COMMIT}),
            "acme/tiny-embed-old": FakeRepo(older, OLDER, refs={"main": OLDER}),
            "acme/gated": FakeRepo(files, COMMIT, refs={"main": COMMIT}, gated=True),
        }
    )


def test_ids_parse_and_paths_do_not() -> None:
    assert parse_hub_id("BAAI/bge-small-en-v1.5") == HubRef("BAAI/bge-small-en-v1.5", None)
    assert parse_hub_id("Qwen/Qwen3-Embedding-0.6B@" + COMMIT) == HubRef("Qwen/Qwen3-Embedding-0.6B", COMMIT)
    assert parse_hub_id("org/name", revision="v2") == HubRef("org/name", "v2")
    assert parse_hub_id("org/name@refs/pr/1") == HubRef("org/name", "refs/pr/1")
    for not_an_id in ("/abs/path", "./rel/x", "~/x/y", "a/b/c", "name", "org/../x", "org/na--me", "-org/x", "org/"):
        assert parse_hub_id(not_an_id) is None, not_an_id
    with pytest.raises(ModelNotFound, match="give one"):
        parse_hub_id("org/name@v1", revision="v2")


def test_origin_is_read_from_a_snapshot_path(tmp_path: Path) -> None:
    snap = tmp_path / "models--acme--tiny-embed" / "snapshots" / COMMIT
    assert hub_origin(snap) == ("acme/tiny-embed", COMMIT)
    assert hub_origin(tmp_path / "models--acme--tiny-embed" / "snapshots" / "main") is None
    assert hub_origin(tmp_path / "somewhere" / COMMIT) is None


def test_download_then_resolve_from_the_cache_without_network(tmp_path: Path, hub: FakeHub) -> None:
    from huggingface_hub import snapshot_download

    cache = tmp_path / "hf"
    lines: list[str] = []
    with serving(hub) as endpoint:
        folder = HubCache(cache, endpoint=endpoint).resolve(HubRef("acme/tiny-embed", "v1.0"), lines.append)
        offline = HubCache(cache, offline=True, endpoint=endpoint)
        with pytest.raises(ModelNotFound, match="offline"):  # the cache knows the tag, not the default branch
            offline.resolve(HubRef("acme/tiny-embed"), lines.append)
        fetched = len(hub.requests)
        assert HubCache(cache, endpoint=endpoint).resolve(HubRef("acme/tiny-embed"), lines.append) == folder
        assert not [r for r in hub.requests[fetched:] if "/resolve/" in r], "no file is fetched twice"
    assert hub_origin(folder) == ("acme/tiny-embed", COMMIT)
    assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()
    assert not (folder / "pytorch_model.bin").exists(), "other frameworks' weights are never fetched"
    assert any("downloading acme/tiny-embed@v1.0" in line for line in lines)
    assert any(f"revision {COMMIT}" in line for line in lines)

    # the server is gone: the branch, the tag and the commit all resolve from the cache alone, to
    # the folder huggingface_hub itself finds there (asked for the same files: never other weights)
    for revision in (None, "main", "v1.0", COMMIT):
        ours = offline.resolve(HubRef("acme/tiny-embed", revision), lines.append)
        theirs = snapshot_download(
            "acme/tiny-embed", revision=revision, cache_dir=cache, local_files_only=True, ignore_patterns=IGNORED_FILES
        )
        assert ours == Path(theirs) == folder, revision


def test_the_store_resolves_hub_ids_and_the_card_origin(tmp_path: Path, hub: FakeHub) -> None:
    cache = tmp_path / "hf"
    with serving(hub) as endpoint:
        env = {"VLLM_SRUN_MODELS": str(tmp_path / "store"), "HF_ENDPOINT": endpoint}
        store = LocalModelStore.from_env(env, hub_cache=cache)
        folder = store.resolve("acme/tiny-embed-old@main", lambda _line: None)
    assert hub_origin(folder) == ("acme/tiny-embed-old", OLDER)
    offline = LocalModelStore.from_env(
        {"VLLM_SRUN_MODELS": str(tmp_path / "store"), "HF_HUB_OFFLINE": "1"}, hub_cache=cache
    )
    assert offline.hub.offline
    assert offline.resolve("acme/tiny-embed-old", lambda _line: None) == folder
    with pytest.raises(ModelNotFound, match="offline"):
        offline.resolve("acme/tiny-embed", lambda _line: None)


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        (HubRef("acme/nothing-here"), "no such repository"),
        (HubRef("acme/gated"), "gated repository"),
        (HubRef("acme/tiny-embed", "no-such-branch"), "revision no-such-branch does not exist"),
    ],
)
def test_hub_failures_are_one_line(tmp_path: Path, hub: FakeHub, ref: HubRef, message: str) -> None:
    with serving(hub) as endpoint, pytest.raises(ModelNotFound, match=message) as caught:
        HubCache(tmp_path / "hf", endpoint=endpoint).resolve(ref, lambda _line: None)
    assert "\n" not in str(caught.value)


def test_no_network_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFound, match="cannot be reached") as caught:
        HubCache(tmp_path / "hf", endpoint="http://127.0.0.1:9").resolve(HubRef("acme/x"), lambda _line: None)
    assert "\n" not in str(caught.value)


def test_offline_never_asks_the_hub(tmp_path: Path, hub: FakeHub) -> None:
    with serving(hub) as endpoint, pytest.raises(ModelNotFound, match="offline"):
        HubCache(tmp_path / "hf", offline=True, endpoint=endpoint).resolve(HubRef("acme/tiny-embed"), lambda _l: None)
    assert hub.requests == []


def test_an_unreadable_cache_entry_is_one_line(tmp_path: Path, hub: FakeHub) -> None:
    cache = tmp_path / "hf"
    with serving(hub) as endpoint:
        folder = HubCache(cache, endpoint=endpoint).resolve(HubRef("acme/tiny-embed"), lambda _line: None)
    (folder / "config.json").unlink()
    (folder / "modules.json").unlink(missing_ok=True)
    with pytest.raises(ModelNotFound, match=r"incomplete|no config\.json") as caught:
        HubCache(cache, offline=True).resolve(HubRef("acme/tiny-embed"), lambda _line: None)
    assert "\n" not in str(caught.value)
