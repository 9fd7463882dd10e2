"""`vllm-srun batch`'s trips, each met by following docs/batch.md literally (issue 45):
a keyed server without its key stops the run (no 401 line is ever counted as an answer, a rerun
with the key answers everything, and an older output full of 401 lines is asked again); a file
that is not batch output given as OUTPUT is refused and left as it was; refusals are one line;
a server that never answers is waited for out loud, for `--wait` seconds."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.server import free_port, running_server
from tests.e2e.test_keys_tls_e2e import add_key
from tests.stores import subprocess_env

pytestmark = pytest.mark.slow
CLI = [sys.executable, "-m", "vllm_srun.app.cli"]
LINES = 6
KEY_ENV = "VLLM_SRUN_API_KEY"


def _batch(*args: str, key: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = subprocess_env()
    env.pop(KEY_ENV, None)
    if key is not None:
        env[KEY_ENV] = key
    return subprocess.run([*CLI, "batch", *args], capture_output=True, text=True, env=env, timeout=timeout)


@pytest.fixture(scope="module")
def keyed(encoder_fixture, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:  # type: ignore[no-untyped-def]
    keys = tmp_path_factory.mktemp("keys") / "keys.txt"
    key = add_key("team", keys)
    with running_server(str(encoder_fixture("embed")), "--api-key-file", str(keys)) as base:
        yield base, key


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "in.jsonl"
    lines = [
        {"custom_id": f"c{i}", "method": "POST", "url": "/v1/embeddings", "body": {"input": f"text {i}"}}
        for i in range(LINES)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _statuses(out: Path) -> list[int]:
    return [json.loads(line)["response"]["status_code"] for line in out.read_text().splitlines()]


def test_a_missing_key_stops_the_run_and_a_rerun_with_the_key_answers_all(
    keyed: tuple[str, str], source: Path, tmp_path: Path
) -> None:
    base, key = keyed
    out = tmp_path / "out.jsonl"
    refused = _batch(str(source), str(out), "--url", base)
    assert refused.returncode != 0
    assert "401" in refused.stderr and "VLLM_SRUN_API_KEY" in refused.stderr
    assert 401 not in (_statuses(out) if out.exists() else [])

    done = _batch(str(source), str(out), "--url", base, key=key)
    assert done.returncode == 0, done.stderr
    assert _statuses(out) == [200] * LINES


def test_an_older_output_of_401_lines_is_asked_again(keyed: tuple[str, str], source: Path, tmp_path: Path) -> None:
    base, key = keyed
    out = tmp_path / "out.jsonl"
    unauthorized = b'{"error":{"code":"unauthorized","message":"a key is required"}}'
    out.write_bytes(
        b"".join(
            b'{"id":"batch_req_%d","custom_id":"c%d","response":{"status_code":401,"request_id":"r","body":%s},'
            b'"error":null}\n' % (i, i, unauthorized)
            for i in range(LINES)
        )
    )
    done = _batch(str(source), str(out), "--url", base, key=key)
    assert done.returncode == 0, done.stderr
    assert f"{LINES} lines of {out}" in done.stderr and "asked again" in done.stderr
    assert _statuses(out) == [200] * LINES


@pytest.mark.parametrize("swap", [True, False])
def test_a_file_that_is_not_batch_output_is_never_appended_to(
    keyed: tuple[str, str], source: Path, tmp_path: Path, swap: bool
) -> None:
    base, key = keyed
    if swap:  # INPUT and OUTPUT swapped: the request file is named as OUTPUT
        target, given = source, tmp_path / "answers.jsonl"
        given.write_text(source.read_text())
        args = [str(given), str(target)]
    else:
        target = tmp_path / "notes.jsonl"
        target.write_text('{"custom_id":"x","method":"POST","url":"/v1/embeddings","body":{"input":"y"}}')
        args = [str(source), str(target)]
    before = target.read_bytes()
    refused = _batch(*args, "--url", base, key=key)
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and "not a batch output line" in refused.stderr
    assert target.read_bytes() == before


def test_refusals_are_one_line(source: Path, tmp_path: Path) -> None:
    nope = _batch(str(source), str(tmp_path / "out.jsonl"), "--model", "nope-model")
    assert nope.returncode == 2 and nope.stderr.count("\n") == 1, nope.stderr
    assert "nope-model" in nope.stderr and "Traceback" not in nope.stderr
    folder = tmp_path / "a-folder"
    folder.mkdir()
    bad_out = _batch(str(source), str(folder), "--url", "http://127.0.0.1:9")
    assert bad_out.returncode == 2 and bad_out.stderr.count("\n") == 1 and "not a file" in bad_out.stderr


def test_a_server_that_never_answers_is_waited_for_out_loud(source: Path, tmp_path: Path) -> None:
    started = time.monotonic()
    gone = _batch(str(source), str(tmp_path / "out.jsonl"), "--url", f"http://127.0.0.1:{free_port()}", "--wait", "3")
    assert time.monotonic() - started < 60
    assert gone.returncode == 2
    lines = gone.stderr.splitlines()
    assert any("waiting for" in line and "--wait" in line for line in lines), gone.stderr
    assert "not ready after 3 s" in lines[-1] and "Traceback" not in gone.stderr
