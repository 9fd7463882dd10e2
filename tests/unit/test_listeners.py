"""Unix sockets only their user can reach: mode 0600, a stale socket replaced at start, a live
one or a regular file refused, removed at exit; the front's socket folders left by a killed
front removed by the next one (docs/hardening.md)."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_srun.adapters.http.listeners import bind_unix, ensure_descriptors
from vllm_srun.adapters.workers.socket_dirs import OWNER_FILE, clean_stale_socket_dirs, make_socket_dir


def test_a_unix_socket_is_private_and_removed_at_exit(tmp_path: Path) -> None:
    path = str(tmp_path / "w.sock")
    listener = bind_unix(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and listener.where == f"unix:{path}"
    listener.sock.close()
    listener.remove()
    assert not os.path.exists(path)


def test_a_stale_socket_is_replaced_a_live_one_or_a_file_refused(tmp_path: Path) -> None:
    path = str(tmp_path / "w.sock")
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(path)
    stale.close()  # the file stays, nobody listens: what a killed worker leaves
    listener = bind_unix(path)
    listener.sock.listen()
    with pytest.raises(ValueError, match="another server is listening"):
        bind_unix(path)
    listener.sock.close()
    regular = tmp_path / "notes.txt"
    regular.write_text("keep me")
    with pytest.raises(ValueError, match="not a socket"):
        bind_unix(str(regular))
    assert regular.read_text() == "keep me"


def test_a_newer_servers_socket_is_not_removed(tmp_path: Path) -> None:
    path = str(tmp_path / "w.sock")
    old = bind_unix(path)
    old.sock.close()
    new = bind_unix(path)  # the stale one is replaced
    old.remove()
    assert os.path.exists(path)
    new.sock.close()
    new.remove()


def test_socket_folders_of_fronts_that_are_gone_are_removed(tmp_path: Path) -> None:
    mine = make_socket_dir(str(tmp_path))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left = tmp_path / "vllm-sr-left"
    left.mkdir()
    (left / OWNER_FILE).write_text(dead.stdout)
    (left / "w0.sock").write_text("")
    unknown = tmp_path / "vllm-sr-unknown"  # no owner note: not ours to judge
    unknown.mkdir()
    assert clean_stale_socket_dirs(str(tmp_path)) == [str(left)]
    assert os.path.isdir(mine) and os.path.isdir(unknown) and not left.exists()


def test_the_descriptor_limit_fits_the_connection_cap() -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert ensure_descriptors(64, explicit=True) == (64, None)
    if hard != resource.RLIM_INFINITY:
        with pytest.raises(ValueError, match="ulimit -n"):
            ensure_descriptors(hard + 1, explicit=True)
        cap, warning = ensure_descriptors(hard + 1, explicit=False)
        assert cap < hard and warning is not None
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
