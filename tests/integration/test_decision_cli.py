"""CLI for decision models: refusals before any model loads (R-ARG-2, R-LEN-1, R-SC-2) and the
decision fixture writer (R-PKG-3)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.stores import session_store, subprocess_env
from vllm_srun.adapters.families.registry import FamilyRegistry
from vllm_srun.app.cli import main
from vllm_srun.app.preflight import engine_arg_refusal
from vllm_srun.domain.settings.engine_args import EngineArgs


def refused(*argv: str) -> str:
    """`vllm-srun serve ARGV` in its own process (it sets OpenMP's and torch's thread counts for the
    worker it would become, which must not leak into this test process): refused in one line."""
    done = subprocess.run(
        [sys.executable, "-m", "vllm_srun.app.cli", "serve", *argv],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=120,
    )
    assert done.returncode != 0
    err = done.stderr.strip().splitlines()
    assert len(err) == 1, err  # one line saying what and why
    return err[0]


def test_max_model_len_is_refused_for_a_non_decision_model(encoder_fixture, decision_fixture) -> None:
    line = refused(str(encoder_fixture("embed")), "--max-model-len", "64")
    assert "--max-model-len applies to decision models only" in line and "encoder" in line
    # served next to a decision model it is refused all the same: the flag applies to every model
    line = refused(str(decision_fixture("llama")), str(encoder_fixture("embed")), "--max-model-len", "64")
    assert "tiny-embed" in line


def test_max_model_len_above_the_package_limit_is_refused(decision_fixture) -> None:
    line = refused(str(decision_fixture("llama")), "--max-model-len", "1025")
    assert "--max-model-len 1025 is above the limit" in line and "1024" in line


@pytest.mark.parametrize("flag", ["--enable-shared-context", "--no-enable-shared-context"])
def test_shared_context_flags_are_refused_for_encoders(encoder_fixture, flag: str) -> None:
    line = refused(str(encoder_fixture("embed")), flag)
    assert flag in line and "decision models only" in line


def test_max_model_len_must_be_positive() -> None:
    assert "--max-model-len" in refused("--max-model-len", "0")


def test_valid_decision_arguments_pass(decision_fixture) -> None:
    folder = str(decision_fixture("llama"))
    quiet = lambda _m: None  # noqa: E731
    store, families = session_store(), FamilyRegistry()
    args = EngineArgs(max_model_len=1024, enable_shared_context=False)
    assert engine_arg_refusal([folder], args, store, families, quiet) is None
    # a name neither in the store nor in the catalog is refused here, in one line, before any load
    refusal = engine_arg_refusal(["not-a-model-anywhere"], EngineArgs(max_model_len=8), store, families, quiet)
    assert refusal is not None and "'not-a-model-anywhere' is not a folder, not in the model store" in refusal
    # a built-in name is left to the load, which pulls it when the store lacks it
    assert engine_arg_refusal(["all-MiniLM-L6-v2"], EngineArgs(), store, families, quiet) is None


def test_fixture_is_deterministic_by_seed(tmp_path: Path) -> None:
    from vllm_srun.app.fixtures import write_fixture

    a = write_fixture(tmp_path / "a", "decision", "qwen3", 3, golden=False)
    b = write_fixture(tmp_path / "b", "decision", "qwen3", 3, golden=False)
    c = write_fixture(tmp_path / "c", "decision", "qwen3", 4, golden=False)
    for name in ("model.safetensors", "tokenizer.json", "config.json", "srun.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()


def test_fixture_cli_writes_a_decision_package_with_golden(tmp_path: Path, capsys) -> None:
    out = tmp_path / "pkg"
    assert main(["fixture", str(out), "--family", "decision", "--seed", "1"]) == 0
    names = {p.name for p in out.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "srun.json",
        "golden.json",
    } <= names
    with pytest.raises(SystemExit):
        main(["fixture", str(tmp_path / "x"), "--family", "decision", "--variant", "gpt2"])
