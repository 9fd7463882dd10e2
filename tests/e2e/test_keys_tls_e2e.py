"""Keys and TLS end to end (R-AUTH-1, R-AUTH-3, R-AUTH-4), real processes on loopback:
`vllm-srun key add` prints one key and appends its digest; a worker with `--api-key-file` and a
certificate the test made serves the official openai, cohere and typesafe-sdk clients unmodified
with `api_key=` over https; a front with its own key file reaches that worker as an endpoint
replica with the internal token, verifying its certificate with the CA file; a worker that would
be reachable from other machines without a key refuses to start."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.e2e.server import free_port
from tests.logs import log_path as log_path_of
from tests.stores import subprocess_env
from tests.tls_certs import Pki, make_pki

TOKEN = "internal-token-for-the-test-0123456789"
TOKEN_ENV = "VLLM_SRUN_INTERNAL_TOKEN"


def add_key(tenant: str, file: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "vllm_srun.app.cli", "key", "add", tenant, "--api-key-file", str(file)],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and done.stderr == ""
    return lines[0]


@contextmanager
def process(argv: list[str], ready: str, verify: object = True, env: dict[str, str] | None = None) -> Iterator[Path]:
    """Run `python -m ARGV` until READY (a URL) answers 200; SIGTERM at the end. Yields its log."""
    log_path = log_path_of(f"vllm-keys-e2e-{time.monotonic_ns()}.log")
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", *argv], stdout=log, stderr=subprocess.STDOUT, env=subprocess_env(env),
            start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, log_path.read_text()[-3000:]
            try:
                if httpx.get(ready, timeout=2, verify=verify).status_code == 200:  # type: ignore[arg-type]
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.2)
        yield log_path
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    file = tmp_path_factory.mktemp("keys") / "api-keys"
    return file, {tenant: add_key(tenant, file) for tenant in ("acme", "beta")}


@pytest.fixture(scope="module")
def tls_worker(
    encoder_fixture, decision_fixture, pki: Pki, keys: tuple[Path, dict[str, str]]
) -> Iterator[tuple[str, Path]]:  # type: ignore[no-untyped-def]
    port = free_port()
    models = [str(encoder_fixture("embed")), str(encoder_fixture("rerank")), str(decision_fixture())]
    argv = [
        "vllm_srun.app.cli", "serve", *models, "--port", str(port), "--log-level", "info",
        "--api-key-file", str(keys[0]), "--ssl-certfile", str(pki.cert), "--ssl-keyfile", str(pki.key),
    ]  # fmt: skip
    base = f"https://127.0.0.1:{port}"
    with process(argv, base + "/health", verify=str(pki.ca), env={TOKEN_ENV: TOKEN}) as log:
        yield base, log


def test_key_add_prints_one_key_and_appends_its_digest(tmp_path: Path) -> None:
    file = tmp_path / "keys"
    first, second = add_key("team-a", file), add_key("team-a", file)
    assert first != second and len(first) >= 40
    assert file.stat().st_mode & 0o777 == 0o600
    digests = [hashlib.sha256(k.encode()).hexdigest() for k in (first, second)]
    assert file.read_text() == "".join(f"team-a {d}\n" for d in digests)
    refused = subprocess.run(
        [sys.executable, "-m", "vllm_srun.app.cli", "key", "add", "a b", "--api-key-file", str(file)],
        capture_output=True, text=True, env=subprocess_env(), timeout=60,
    )  # fmt: skip
    assert refused.returncode == 2 and refused.stdout == "" and len(refused.stderr.splitlines()) == 1


def test_official_clients_work_with_api_key_over_https(
    tls_worker: tuple[str, Path], pki: Pki, keys: tuple[Path, dict[str, str]]
) -> None:
    import cohere
    import httpx2
    import openai
    from typesafe_sdk import Noul, TypeSafeClient

    base, _ = tls_worker
    key = keys[1]["acme"]
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, http_client=httpx.Client(verify=str(pki.ca)))
    assert len(client.embeddings.create(model="tiny-embed", input=["hello"]).data[0].embedding) > 0
    co = cohere.ClientV2(api_key=keys[1]["beta"], base_url=base, httpx_client=httpx.Client(verify=str(pki.ca)))
    assert len(co.rerank(model="tiny-rerank", query="q", documents=["a", "b"]).results) == 2
    with TypeSafeClient(
        api_key=key, base_url=base, model="tiny-decision-llama", http_client=httpx2.Client(verify=str(pki.ca))
    ) as sdk:
        answer = sdk.system_one(state="the sky is blue", questions={"blue": Noul(instructions="Is the sky blue?")})
        assert 0 <= answer.nouls["blue"].noul <= 1
    wrong = openai.OpenAI(base_url=f"{base}/v1", api_key="srk-wrong", http_client=httpx.Client(verify=str(pki.ca)))
    with pytest.raises(openai.AuthenticationError) as refused:
        wrong.embeddings.create(model="tiny-embed", input=["hello"])
    assert refused.value.status_code == 401
    assert refused.value.response.headers["www-authenticate"].startswith("Bearer")
    with pytest.raises(httpx.ConnectError):  # a certificate the client's CA did not sign
        httpx.get(base + "/health", verify=str(pki.other_ca))


def test_the_worker_client_verifies_the_replica_certificate(tls_worker: tuple[str, Path], pki: Pki) -> None:
    from vllm_srun.adapters.workers.http_client import WorkerClient, WorkerUnreachable, tls_context

    port = int(tls_worker[0].rsplit(":", 1)[1])

    async def go() -> None:
        good = WorkerClient(host="127.0.0.1", port=port, tls=tls_context(str(pki.ca)), token=TOKEN)
        assert (await good.request("GET", "/health")).status == 200
        answer = await good.request(
            "POST", "/v1/embeddings", json.dumps({"model": "tiny-embed", "input": "x"}).encode(),
            headers=((b"x-vllm-srun-tenant", b"beta"),),
        )  # fmt: skip
        assert answer.status == 200  # the token lets the front name a tenant
        good.close_idle()
        with pytest.raises(WorkerUnreachable, match="TLS"):
            await WorkerClient(host="127.0.0.1", port=port, tls=tls_context(str(pki.other_ca))).request(
                "GET", "/health"
            )

    asyncio.run(go())


def test_a_front_with_keys_reaches_a_tls_replica_with_its_token(
    tls_worker: tuple[str, Path], pki: Pki, keys: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    base, worker_log = tls_worker
    deployment = {
        "artifact": "tiny-embed",
        "endpoint": base,
        "model": "tiny-embed",
        "ca_file": str(pki.ca),
        "internal_token_env": TOKEN_ENV,
    }
    config = tmp_path / "front.yaml"
    config.write_text(json.dumps({"global": {"model_catalog": {"deployments": {"embed": deployment}}}}))
    port = free_port()
    argv = [
        "vllm_srun.app.front_cli", "serve", "--config", str(config), "--port", str(port),
        "--api-key-file", str(keys[0]), "--log-level", "info", "--pid-file", str(tmp_path / "pid.json"),
    ]  # fmt: skip
    front = f"http://127.0.0.1:{port}"
    with process(argv, front + "/health", env={TOKEN_ENV: TOKEN}) as front_log:
        body = {"model": "embed", "input": ["hello"]}
        for tenant in ("acme", "beta"):
            ok = httpx.post(front + "/v1/embeddings", json=body, headers={"authorization": f"Bearer {keys[1][tenant]}"})
            assert ok.status_code == 200, ok.text  # beta: a tenant the worker takes only with the token
        missing = httpx.post(front + "/v1/embeddings", json=body)
        assert missing.status_code == 401 and missing.headers["www-authenticate"].startswith("Bearer")
        assert httpx.get(front + "/api/v1/inventory").status_code == 401
        # the replica itself: nothing without a key or the token
        assert httpx.post(base + "/v1/embeddings", json=body, verify=str(pki.ca)).status_code == 401
        logs = front_log.read_text() + worker_log.read_text()
    for secret in (TOKEN, *keys[1].values(), *(hashlib.sha256(k.encode()).hexdigest() for k in keys[1].values())):
        assert secret not in logs


def test_a_worker_open_to_other_machines_without_keys_refuses_to_start(encoder_fixture) -> None:  # type: ignore[no-untyped-def]
    argv = [sys.executable, "-m", "vllm_srun.app.cli", "serve", str(encoder_fixture("embed")), "--host", "0.0.0.0"]
    done = subprocess.run(
        [*argv, "--port", str(free_port())], capture_output=True, text=True, env=subprocess_env(), timeout=120
    )
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert "--host 0.0.0.0 is reachable from other machines" in line and "--allow-unauthenticated" in line


def test_sigterm_ends_a_tls_worker_at_once_though_a_client_keeps_its_connection_open(encoder_fixture, pki: Pki) -> None:  # type: ignore[no-untyped-def]
    """An idle keep-alive client never answers the TLS close: the worker drops that connection
    after a second instead of waiting asyncio's 30 s for it (`guarded_protocol.TLS_CLOSE_S`)."""
    port = free_port()
    argv = [sys.executable, "-m", "vllm_srun.app.cli", "serve", str(encoder_fixture("embed")), "--port", str(port)]
    argv += ["--ssl-certfile", str(pki.cert), "--ssl-keyfile", str(pki.key), "--log-level", "warning"]
    proc = subprocess.Popen(argv, env=subprocess_env(), start_new_session=True)
    base = f"https://127.0.0.1:{port}"
    try:
        with httpx.Client(verify=str(pki.ca)) as client:
            deadline = time.monotonic() + 180
            while True:
                assert proc.poll() is None and time.monotonic() < deadline
                try:
                    if client.get(base + "/health").status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.2)
            assert client.post(base + "/v1/embeddings", json={"input": "kept alive"}).status_code == 200
            started = time.monotonic()
            os.killpg(proc.pid, signal.SIGTERM)  # the client's connection stays open, idle
            proc.wait(timeout=20)
            assert time.monotonic() - started < 10
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
