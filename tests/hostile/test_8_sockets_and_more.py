"""Issue 9, class 8 (smaller): a standalone `--uds` socket was mode 0666 and stayed on disk after
SIGTERM; the front's socket folder stayed after SIGKILL; a client that half-closed after a full
request got no answer; the lone-surrogate error said "Input data was truncated"."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.hostile.clients import Server, connect, model_name, post, read_until_closed
from tests.stores import subprocess_env

pytestmark = pytest.mark.slow


def wait_for(check, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def worker_on_socket(fixture: Path, path: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "vllm_srun.app.cli", "serve", str(fixture), "--uds", str(path)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=subprocess_env(),
            start_new_session=True,
        )


def live(path: Path) -> bool:
    try:
        transport = httpx.HTTPTransport(uds=str(path))
        with httpx.Client(transport=transport, base_url="http://worker", timeout=2) as client:
            return client.get("/health/live").status_code == 200
    except httpx.HTTPError:
        return False


def test_a_unix_socket_is_private_replaces_a_stale_one_and_goes_at_exit(encoder_fixture, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "w.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()  # a socket file nobody listens on, as a SIGKILLed worker leaves it
    first = worker_on_socket(encoder_fixture("embed"), path, tmp_path / "first.log")
    try:
        wait_for(lambda: live(path), 60, "the worker on its socket")
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        second = subprocess.run(
            [sys.executable, "-m", "vllm_srun.app.cli", "serve", str(encoder_fixture("embed")), "--uds", str(path)],
            capture_output=True,
            text=True,
            env=subprocess_env(),
            timeout=120,
        )
        assert second.returncode == 2 and "another server is listening" in second.stderr
        assert len(second.stderr.strip().splitlines()) == 1
    finally:
        os.killpg(first.pid, signal.SIGTERM)
        first.wait(30)
    assert not path.exists()


def test_a_killed_fronts_socket_folder_is_removed_by_the_next(encoder_fixture, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    env = subprocess_env({"TMPDIR": str(tmp_path)})
    argv = [
        sys.executable,
        "-m",
        "vllm_srun.app.front_cli",
        "serve",
        str(encoder_fixture("embed")),
        "--platform",
        "cpu",
    ]

    def run_front(port: int) -> subprocess.Popen[bytes]:
        # the pid file elsewhere: its default folder (<tmp>/vllm-sr-UID) is not a socket folder
        pid_file = tmp_path / "pids" / f"{port}.json"
        with (tmp_path / f"front-{port}.log").open("w") as out:
            return subprocess.Popen(
                [*argv, "--port", str(port), "--pid-file", str(pid_file)], stdout=out, stderr=subprocess.STDOUT, env=env
            )

    from tests.e2e.server import free_port

    port = free_port()
    killed = run_front(port)
    wait_for(lambda: list(tmp_path.glob("vllm-sr-*")), 60, "the front's socket folder")
    left = list(tmp_path.glob("vllm-sr-*"))
    killed.send_signal(signal.SIGKILL)
    killed.wait(10)
    assert all(folder.exists() for folder in left)  # nothing could remove it
    port = free_port()
    second = run_front(port)
    try:
        wait_for(lambda: not any(folder.exists() for folder in left), 60, "the stale folder removed")
        wait_for(lambda: _answers(f"http://127.0.0.1:{port}/health/live"), 60, "the second front serving")
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(30)
    assert not list(tmp_path.glob("vllm-sr-*"))  # and the second removed its own at exit


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_half_closed_client_gets_its_answer(target: Server) -> None:
    body = b'{"model": "%s", "input": "half"}' % model_name(target, "embed").encode()
    s = connect(target)
    s.sendall(b"POST /v1/embeddings HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
    s.shutdown(socket.SHUT_WR)
    answer = read_until_closed(s).removeprefix(b"HTTP/1.1 100 Continue\r\n\r\n")  # an interim answer first
    assert answer.startswith(b"HTTP/1.1 200") and b'"embedding"' in answer


def test_a_lone_surrogate_is_named(target: Server) -> None:
    raw = b'{"model": "%s", "input": "broken \\ud800 text"}' % model_name(target, "embed").encode()
    answer = post(target, "/v1/embeddings", raw)
    assert answer.status_code == 400
    message = answer.json()["error"]["message"]
    assert "lone UTF-16 surrogate" in message and "\\ud800" in message and "truncated" not in message
