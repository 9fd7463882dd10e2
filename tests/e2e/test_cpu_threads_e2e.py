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
from vllm_srun.domain.threads import budget_threads

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


def test_the_default_uses_the_whole_cpu_budget_with_passive_waits(minilm_server: str) -> None:
    card = httpx.get(f"{minilm_server}/v1/models").json()["data"][0]
    threads = card["threads"]
    assert threads["forward"] == BUDGET and threads["budget"] == BUDGET
    expected = "PASSIVE" if BUDGET > 1 and not os.environ.get("OMP_WAIT_POLICY") else threads["omp_wait_policy"]
    assert threads["omp_wait_policy"] == expected
    assert threads["adaptive"]["mode"] == 0


@pytest.mark.skipif(BUDGET < 2, reason="adaptive threads need at least two candidate counts")
def test_adaptive_mode_one_learns_from_shadows_and_never_changes_an_answer(minilm_dir: Path) -> None:
    batches = [_texts(1 + (k % 5), k) for k in range(48)]
    common = ("--result-cache-entries", "0", "--threads", str(BUDGET))
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
    flags = ("--result-cache-entries", "0", "--threads", "2", "--concurrent-forwards", "2")
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
