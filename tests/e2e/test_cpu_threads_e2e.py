"""CPU threads of `vllm-srun serve` against real processes (R-CPU-1, R-CPU-2, R-ARG-2): the
default uses the whole budget, bad thread settings are refused before any load, adaptive
threads in mode 1 learn from shadows without ever changing an answer, and concurrent forwards
split the threads and answer as one forward at a time does (MiniLM)."""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.e2e.server import running_server
from tests.stores import subprocess_env
from vllm_srun.adapters.workers.cpu_budget import front_cpu_budget
from vllm_srun.domain.worker.threads import DEFAULT_FORWARD_NICE, budget_threads, default_concurrent_forwards

CLI = [sys.executable, "-m", "vllm_srun.app.cli"]
BUDGET = budget_threads(front_cpu_budget())
WORDS = [
    "route",
    "this",
    "billing",
    "request",
    "to",
    "the",
    "refund",
    "team",
    "because",
    "the",
    "invoice",
    "was",
    "late",
    "again",
]


def _refusal(flags: list[str], env: dict[str, str] | None = None) -> tuple[int, list[str], str]:
    done = subprocess.run(
        [*CLI, "serve", "/not/even/read", *flags],
        capture_output=True,
        text=True,
        timeout=60,
        env=subprocess_env(env),
    )
    return done.returncode, done.stderr.strip().splitlines(), done.stderr


@pytest.mark.parametrize(
    ("flags", "env", "why"),
    [
        (["--threads", str(BUDGET + 1)], None, f"--threads {BUDGET + 1} is above this process's CPU budget"),
        ([], {"VLLM_SRUN_CPU_ADAPTIVE_THREADS": "3"}, "VLLM_SRUN_CPU_ADAPTIVE_THREADS: expected one of 0, 1, 2"),
        ([], {"VLLM_SRUN_CPU_ADAPTIVE_THREADS": "on"}, "VLLM_SRUN_CPU_ADAPTIVE_THREADS: expected one of 0, 1, 2"),
        (["--deterministic"], {"VLLM_SRUN_CPU_ADAPTIVE_THREADS": "2"}, "--deterministic answers at one thread count"),
        (["--deterministic", "--engine", "onnxruntime"], None, "--deterministic: the onnxruntime engine cannot"),
        (["--threads", "1", "--concurrent-forwards", "2"], None, "--concurrent-forwards 2 does not divide the 1"),
        (
            ["--threads", "1", "--concurrent-forwards", "2"],
            {"VLLM_SRUN_CPU_ADAPTIVE_THREADS": "1"},
            "--concurrent-forwards 2: adaptive threads time one forward at a time",
        ),
        (["--concurrent-forwards", "0"], None, "--concurrent-forwards"),
        ([], {"VLLM_SRUN_FORWARD_NICE": "-5"}, "VLLM_SRUN_FORWARD_NICE must be an integer from 0 to 19"),
        ([], {"VLLM_SRUN_EXPRESS_FORWARD": "sometimes"}, "VLLM_SRUN_EXPRESS_FORWARD must be 1/on or 0/off"),
        ([], {"VLLM_SRUN_LANE_YIELD": "maybe"}, "VLLM_SRUN_LANE_YIELD must be 1/on or 0/off"),
    ],
)
def test_bad_thread_settings_are_refused_in_one_line_before_any_load(
    flags: list[str], env: dict[str, str] | None, why: str
) -> None:
    code, lines, stderr = _refusal(flags, env)
    assert code == 2 and len(lines) == 1 and why in lines[0], stderr
    assert "load:" not in stderr


def _texts(n: int, seed: int) -> list[str]:
    return [" ".join(WORDS[(seed + i * j) % len(WORDS)] for j in range(1 + (seed * 7 + i * 13) % 40)) for i in range(n)]


async def _embed_all(base: str, batches: list[list[str]]) -> list[list[bytes]]:
    """Every batch as one request, all at once; each answer's vectors as raw float32 bytes."""
    async with httpx.AsyncClient(base_url=base, timeout=120) as client:

        async def one(texts: list[str]) -> list[bytes]:
            r = await client.post("/v1/embeddings", json={"input": texts, "encoding_format": "base64"})
            assert r.status_code == 200, r.text
            return [base64.b64decode(d["embedding"]) for d in r.json()["data"]]

        return list(await asyncio.gather(*(one(b) for b in batches)))


def _server_pid(base: str) -> int:
    """The pid of the `vllm-srun serve` listening on BASE's port (from its command line)."""
    port = base.rsplit(":", 1)[1]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"serve" in argv and b"--port" in argv and port.encode() in argv:
                return int(entry.name)
    raise AssertionError(f"no server process listens on {base}")


def _thread_nice(pid: int) -> dict[int, int]:
    """Every thread of PID and its nice value (/proc/PID/task/TID/stat, field 19)."""
    found = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        stat = (task / "stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()  # after the command name, which may hold spaces
        found[int(task.name)] = int(fields[16])
    return found


def test_the_default_uses_the_whole_cpu_budget_as_concurrent_forwards_below_the_loops_priority(
    minilm_server: str,
) -> None:
    card = httpx.get(f"{minilm_server}/v1/models").json()["data"][0]
    threads = card["threads"]
    concurrent = default_concurrent_forwards(BUDGET, adaptive=False)
    assert threads["concurrent_forwards"] == concurrent and threads["budget"] == BUDGET
    assert threads["forward"] * concurrent == BUDGET  # every CPU of the budget runs forwards
    team = threads["forward"]
    expected = "PASSIVE" if team > 1 and not os.environ.get("OMP_WAIT_POLICY") else threads["omp_wait_policy"]
    assert threads["omp_wait_policy"] == expected
    assert threads["adaptive"]["mode"] == 0
    merged = card["merged_forward_tokens"]  # R-BAT-5: an exact model says how far it merges
    assert (card["numerics"] == "exact") == (merged is not None) and (merged is None or 256 <= merged <= 512)
    lone = threads["lone_forward"]  # a forward alone on the device takes the whole budget
    if concurrent > 1 and team < BUDGET and not os.environ.get("VLLM_SRUN_LONE_FORWARD"):
        differs = (
            lone["threads"] is None and "answers differ" in lone["reason"] and card["kernels"]["linear"] == "eager"
        )
        assert lone["threads"] == BUDGET or differs, (lone, card["kernels"])  # eager F.linear may change bits
        if lone["threads"] == BUDGET:
            before = lone["forwards"]
            httpx.post(f"{minilm_server}/v1/embeddings", json={"input": ["a lone request"], "model": card["id"]})
            after = httpx.get(f"{minilm_server}/v1/models").json()["data"][0]["threads"]["lone_forward"]
            assert after["forwards"] > before
    else:
        assert lone["threads"] is None and lone["reason"], lone
    # R-FAIR-7: with concurrent forwards, the lightest tenant's next turn may run beside busy slots
    assert threads["express_forward"] is (concurrent > 1 and not os.environ.get("VLLM_SRUN_EXPRESS_FORWARD"))
    if not sys.platform.startswith("linux") or os.environ.get("VLLM_SRUN_FORWARD_NICE"):
        return
    assert threads["forward_nice"] == DEFAULT_FORWARD_NICE
    asyncio.run(_embed_all(minilm_server, [_texts(3, k) for k in range(16)]))  # every device thread started
    pid = _server_pid(minilm_server)
    nice = _thread_nice(pid)
    base = nice[pid]  # the main thread runs the event loop
    niced = [tid for tid, value in nice.items() if value == min(19, base + DEFAULT_FORWARD_NICE)]
    assert len(niced) >= concurrent, nice  # each forward thread (and any OpenMP member it started)
    assert len(niced) < len(nice), nice  # ... and not the loop or request preparation


@pytest.mark.skipif(BUDGET < 2, reason="adaptive threads need at least two candidate counts")
def test_adaptive_mode_one_learns_from_shadows_and_never_changes_an_answer(minilm_dir: Path) -> None:
    batches = [_texts(1 + (k % 5), k) for k in range(48)]
    # adaptive threads run one forward at a time: the plain server too, so both serve BUDGET threads
    common = ("--result-cache-entries", "0", "--threads", str(BUDGET), "--concurrent-forwards", "1")
    with running_server(*common) as plain:
        expected = asyncio.run(_embed_all(plain, batches))
    with running_server(*common, env={"VLLM_SRUN_CPU_ADAPTIVE_THREADS": "1"}) as learning:
        for _ in range(3):  # concurrent rounds, so forwards of several sizes run and are shadowed
            assert asyncio.run(_embed_all(learning, batches)) == expected
        card = httpx.get(f"{learning}/v1/models").json()["data"][0]
        metrics = httpx.get(f"{learning}/metrics").text
    adaptive = card["threads"]["adaptive"]
    assert adaptive["mode"] == 1 and adaptive["phase"] in ("learning", "learned"), adaptive
    assert adaptive["shadows_run"] > 0 and adaptive["buckets"], adaptive
    assert card["threads"]["forward"] == BUDGET  # mode 1 serves the configured count only
    shadows = [line for line in metrics.splitlines() if line.startswith("vllm_srun_adaptive_shadows_total")]
    assert shadows and all('outcome="match"' in line for line in shadows), shadows
    assert any(line.startswith("vllm_srun_adaptive_threads_learned{") for line in metrics.splitlines())


@pytest.mark.skipif(BUDGET < 2, reason="two concurrent forwards need two threads")
def test_concurrent_forwards_split_the_threads_and_answer_as_forwards_one_at_a_time(minilm_dir: Path) -> None:
    batches = [_texts(1 + (k % 5), k) for k in range(48)]
    # profile batching: concurrent requests merge even where the probe finds the model approximate
    flags = ("--result-cache-entries", "0", "--threads", "2", "--concurrent-forwards", "2", "--profile", "batching")
    with running_server(*flags) as base:
        card = httpx.get(f"{base}/v1/models").json()["data"][0]
        alone = [asyncio.run(_embed_all(base, [b]))[0] for b in batches]  # one request at a time
        together = asyncio.run(_embed_all(base, batches))  # all at once: merged, two forwards at a time
        metrics = httpx.get(f"{base}/metrics").text
    threads = card["threads"]
    assert threads["forward"] == 1 and threads["concurrent_forwards"] == 2, threads
    assert threads["omp_wait_policy"] is None or os.environ.get("OMP_WAIT_POLICY")  # a team of one waits for no one
    forwards = sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("vllm_srun_forwards_total{") and 'outcome="ok"' in line
    )
    assert forwards < 2 * len(batches)  # the concurrent round merged rows
    if card["numerics"] == "exact":  # batch-invariant at this thread count: the same bits in any company
        assert together == alone
    else:  # the kernel plan at one thread left merged forwards approximate: same answers to rounding
        import numpy as np

        for a, b in zip(together, alone):
            x = np.frombuffer(b"".join(a), dtype=np.float32)
            y = np.frombuffer(b"".join(b), dtype=np.float32)
            assert np.abs(x - y).max() < 1e-5
