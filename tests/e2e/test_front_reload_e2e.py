"""`vllm-sr reload` on a real front under continuous load (R-REP-2, seed 004): a reload that adds a
replica, one that removes one, one that changes the deployment's model, and a refused one —
no request fails or hangs, and the inventory is right after each."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.front import FrontProcess, running_front
from tests.stores import subprocess_env

pytestmark = pytest.mark.slow


def config_text(artifact: Path, replicas: int, **extra: Any) -> str:
    fields = "".join(f"        {key}: {value}\n" for key, value in extra.items())
    return (
        "global:\n  model_catalog:\n    deployments:\n      primary:\n"
        f"        artifact: {artifact}\n"
        f"        replicas: [{', '.join(['{device: cpu}'] * replicas)}]\n"
        "        result_cache_entries: 0\n" + fields
    )


class Load:
    """Clients posting one after another until stopped; every answer and failure is kept."""

    def __init__(self, base: str, clients: int = 3) -> None:
        self.base = base
        self.stopped = threading.Event()
        self.statuses: list[int] = []
        self.failures: list[str] = []
        self.threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(clients)]

    def _client(self, index: int) -> None:
        with httpx.Client(base_url=self.base, timeout=30) as client:
            n = 0
            while not self.stopped.is_set():
                n += 1
                try:
                    r = client.post("/v1/embeddings", json={"input": [f"client {index} request {n}", "the cat"]})
                    self.statuses.append(r.status_code)
                    if r.status_code != 200:
                        self.failures.append(f"{r.status_code}: {r.text[:200]}")
                except httpx.HTTPError as exc:  # a timeout is a hung request
                    self.failures.append(f"{type(exc).__name__}: {exc}")

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        for thread in self.threads:
            thread.join(timeout=60)


def reload(pid_file: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vllm_srun.app.front_cli", "reload", "--pid-file", str(pid_file), "--timeout", "240"],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=300,
    )


def workers(front: FrontProcess) -> list[dict[str, Any]]:
    return front.inventory()["deployments"][0]["workers"]


def answered_since(load: Load, count: int) -> bool:
    return len(load.statuses) >= count


def test_reloads_under_load_fail_no_request(encoder_fixture, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    first, second = encoder_fixture("embed", 0), encoder_fixture("embed", 1)
    config, pid_file = tmp_path / "config.yaml", tmp_path / "front.json"
    config.write_text(config_text(first, 1))
    with running_front("--config", str(config), "--pid-file", str(pid_file)) as front, Load(front.base) as load:
        (original,) = workers(front)
        front.wait_for(lambda: answered_since(load, 10), 60, "load running")

        config.write_text(config_text(first, 2))  # add a replica
        done = reload(pid_file)
        assert done.returncode == 0, done.stderr
        assert "kept primary/0" in done.stderr and "started primary/1" in done.stderr
        grown = workers(front)
        assert [w["id"] for w in grown] == ["primary/0", "primary/1"] and all(w["state"] == "ready" for w in grown)
        assert grown[0]["pid"] == original["pid"]  # not restarted
        count = len(load.statuses)
        front.wait_for(lambda: answered_since(load, count + 10), 60, "load after growing")

        config.write_text(config_text(first, 1))  # remove one
        done = reload(pid_file)
        assert done.returncode == 0, done.stderr
        assert "retired primary/1" in done.stderr
        (kept,) = workers(front)
        assert kept["id"] == "primary/0" and kept["pid"] == original["pid"]
        front.wait_for(lambda: front.inventory()["retiring"] == [], 60, "the retired worker stopped")
        count = len(load.statuses)
        front.wait_for(lambda: answered_since(load, count + 10), 60, "load after shrinking")

        config.write_text(config_text(second, 1))  # change the model
        done = reload(pid_file)
        assert done.returncode == 0, done.stderr
        (changed,) = workers(front)
        assert changed["id"] == "primary/2" and changed["pid"] != original["pid"] and changed["state"] == "ready"
        card = httpx.get(f"{front.base}/v1/models", timeout=5).json()["data"][0]
        assert card["artifact"] == str(second)
        count = len(load.statuses)
        front.wait_for(lambda: answered_since(load, count + 10), 60, "load after the model changed")

        config.write_text(config_text(second, 1, max_num_seqs=0, dtype="fp8"))  # refused: nothing changes
        done = reload(pid_file)
        assert done.returncode == 2
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 2 and "max_num_seqs" in lines[0] and "dtype" in lines[1]
        assert [w["pid"] for w in workers(front)] == [changed["pid"]]
        assert front.inventory()["reload"]["state"] == "refused"
    assert load.failures == [], load.failures[:5]
    assert len(load.statuses) >= 40 and set(load.statuses) == {200}
    assert not pid_file.exists()  # the front removed it when it stopped
