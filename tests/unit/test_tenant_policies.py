"""The front's key file reaches its managed workers (R-FAIR-1): a worker's command line names the
file (`--tenant-policies PATH`, never a digest), the worker applies the file's tenant policies
without asking for its keys, and the front's config may name the key file (`global.api_key_file`)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from vllm_srun.adapters.config.loader import load_config_text
from vllm_srun.adapters.config.schema import ConfigError, DeploymentConfig
from vllm_srun.adapters.workers.factory import WorkerFactory
from vllm_srun.app import cli
from vllm_srun.app.keys import security
from vllm_srun.domain.scheduling.tenants import TenantPolicy


def key_file(folder: Path) -> tuple[Path, list[str]]:
    digests = [hashlib.sha256(key.encode()).hexdigest() for key in ("srk-acme-key", "srk-beta-key")]
    path = folder / "keys.txt"
    path.write_text(f"acme {digests[0]} 2 300 -\nbeta {digests[1]}\n")
    return path, digests


def test_a_managed_worker_applies_the_front_key_files_policies_without_its_keys(tmp_path: Path) -> None:
    path, digests = key_file(tmp_path)
    factory = WorkerFactory(socket_dir=str(tmp_path), threads=1, tenant_policies=str(path))
    socket = str(tmp_path / "w0.sock")
    argv = factory.settings(DeploymentConfig(artifact="tiny"), "cpu", socket).to_argv()
    assert f"--tenant-policies={path}" in argv
    assert not any(digest in arg for digest in digests for arg in argv)
    ns = cli.build_parser().parse_args(argv)
    door = security(ns, "127.0.0.1", uds=socket, environ={})
    assert door.tenants.policy("acme") == TenantPolicy(weight=2.0, max_queued_tokens=300)
    assert door.tenants.policy("beta") == TenantPolicy()
    assert not door.auth.required  # the front checked the keys; the worker takes the tenant it names


def test_without_a_key_file_workers_get_no_policy_flag(tmp_path: Path) -> None:
    factory = WorkerFactory(socket_dir=str(tmp_path), threads=1)
    argv = factory.settings(DeploymentConfig(artifact="tiny"), "cpu", str(tmp_path / "w0.sock")).to_argv()
    assert not any(arg.startswith("--tenant-policies") for arg in argv)


def test_bad_policy_files_are_refused_in_one_line(tmp_path: Path) -> None:
    path, _ = key_file(tmp_path)
    socket = str(tmp_path / "w0.sock")
    missing = cli.build_parser().parse_args(["serve", "tiny", f"--tenant-policies={tmp_path / 'none'}"])
    with pytest.raises(ValueError, match=r"^--tenant-policies .*none: No such file") as refused:
        security(missing, "127.0.0.1", uds=socket, environ={})
    assert "\n" not in str(refused.value)
    both = cli.build_parser().parse_args(["serve", "tiny", f"--tenant-policies={path}", "--api-key-file", str(path)])
    with pytest.raises(ValueError, match="not needed"):
        security(both, "127.0.0.1", uds=socket, environ={})


def test_the_front_config_may_name_the_key_file() -> None:
    config = load_config_text("global:\n  api_key_file: /etc/vllm-sr/keys\n", source="c.yaml")
    assert config.global_.api_key_file == "/etc/vllm-sr/keys"
    for bad in ('""', "[a, b]", "7"):
        with pytest.raises(ConfigError) as refused:
            load_config_text(f"global:\n  api_key_file: {bad}\n", source="c.yaml")
        assert any("api_key_file" in problem for problem in refused.value.problems)
