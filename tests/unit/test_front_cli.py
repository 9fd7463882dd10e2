"""`vllm-sr`: flags → the canonical config (`config show`), refusals before any worker starts,
`config migrate` through the CLI, and the example of docs/front.md (R-REP-1, R-ARG)."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest
import yaml

from vllm_srun.adapters.config.loader import load_config_text
from vllm_srun.app import front_cli

DOCS = Path(__file__).resolve().parents[2] / "docs" / "front.md"


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = front_cli.main(argv)
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def shown(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict:
    code, out, err = run(["config", "show", *argv], capsys)
    assert code == 0, err
    return yaml.safe_load(out)


def primary(doc: dict) -> dict:
    return doc["global"]["model_catalog"]["deployments"]["primary"]


def refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    code, out, err = run(argv, capsys)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert re.match(r"vllm-sr( [a-z]+)*: error: ", lines[0]), lines[0]
    return lines[0]


# ---- flags write the canonical config --------------------------------------------------------
def test_no_model_and_no_config_serves_the_embedded_default(capsys: pytest.CaptureFixture[str]) -> None:
    doc = shown([], capsys)
    assert primary(doc) == {"provider": "model_runtime", "artifact": "all-MiniLM-L6-v2"}
    # written where upstream writes it (a root-level `system:` is read the same)
    assert doc["global"]["model_catalog"]["system"]["decision_model"]["deployment"] == "primary"
    assert "system" not in doc


def test_flags_place_workers_and_set_engine_args(capsys: pytest.CaptureFixture[str]) -> None:
    doc = shown(
        [
            "tiny",
            "-e",
            "--platform",
            "cpu",
            "-dp",
            "2",
            "--max-num-seqs",
            "64",
            "--batch-window-ms",
            "0",
            "--result-cache-entries",
            "0",
            "--timeout-ms",
            "500",
            "--no-enable-shared-context",
        ],
        capsys,
    )
    assert primary(doc) == {
        "provider": "model_runtime",
        "artifact": "tiny",
        "replicas": [{"device": "cpu"}, {"device": "cpu"}],
        "max_num_seqs": 64,
        "batch_window_ms": 0.0,
        "enable_shared_context": False,
        "result_cache_entries": 0,
        "timeout_ms": 500,
    }
    load_config_text(yaml.safe_dump(doc))  # what `show` prints loads again


def test_engine_flag_takes_an_engine_or_is_just_engine_mode(capsys: pytest.CaptureFixture[str]) -> None:
    assert primary(shown(["tiny", "--engine", "onnxruntime"], capsys))["engine"] == "onnxruntime"
    assert primary(shown(["-e", "tiny"], capsys))["artifact"] == "tiny"  # `-e MODEL`
    assert "engine" not in primary(shown(["tiny", "-e"], capsys))


def test_model_alone_keeps_configured_replicas_and_engine_args(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        "global:\n  model_catalog:\n    deployments:\n      primary:\n        artifact: old\n"
        "        replicas: [{device: cpu}, {device: cpu}]\n        max_num_seqs: 32\n"
    )
    doc = primary(shown(["new", "--config", str(config)], capsys))
    assert doc["artifact"] == "new" and doc["max_num_seqs"] == 32 and len(doc["replicas"]) == 2
    grown = primary(shown(["--config", str(config), "-dp", "3"], capsys))
    assert grown["replicas"] == [{"device": "cpu"}] * 3 and grown["artifact"] == "old"


# ---- refusals: one line, non-zero, before anything starts ---------------------------------------
def test_router_mode_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "router.yaml"
    config.write_text("global:\n  router: {enabled: true}\n")
    line = refusal(["serve", "--config", str(config)], capsys)
    assert "global.router.enabled: LLM routing is out of scope" in line


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["serve", "tiny", "--bogus"], "unrecognized arguments: --bogus"),
        (["serve", "tiny", "-dp", "0"], "-dp"),
        (["serve", "tiny", "--device-ids", "0", "--platform", "cpu"], "--device-ids places workers on GPUs"),
        (["serve", "tiny", "--dtype", "float16", "--platform", "cpu"], "float16 runs on GPUs only"),
        (["serve", "tiny", "--platform", "cuda", "-dp", "2", "--device-ids", "0,0"], "list each GPU once"),
        (
            ["serve", "tiny", "--engine", "turbo", "--platform", "cpu"],
            "--engine: unknown engine 'turbo': installed are",
        ),
        (["serve", "tiny", "--batch-window-ms", "-1"], "--batch-window-ms"),
        (["serve", "--config", "/nonexistent/config.yaml"], "/nonexistent/config.yaml"),
    ],
)
def test_bad_flags_are_refused_in_one_line(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert needle in refusal(argv, capsys)


def test_every_config_problem_is_on_the_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(
        "global:\n  model_catalog:\n    deployments:\n      primary:\n        artifact: a\n"
        "        max_num_seqs: 0\n        colour: blue\n"
    )
    line = refusal(["serve", "--config", str(config)], capsys)
    assert "max_num_seqs: expected an integer >= 1" in line and "colour: unknown field" in line


@pytest.mark.parametrize(
    ("placement", "problem"),
    [
        (
            "replicas: [{endpoint: 'host:8100', model: m}]",
            "deployments.primary.replicas[0].endpoint: expected an http:// or https:// URL",
        ),
        (
            "replicas: [{endpoint: 'http://h:8100'}]",
            "deployments.primary.replicas[0]: an attached replica ('endpoint') names its model with 'model'",
        ),
        (
            "replicas: [{endpoint: 'http://h:8100', model: m, device: 'cuda:0'}]",
            "deployments.primary.replicas[0]: 'device' cannot be combined with 'endpoint'",
        ),
        (
            "replicas: [{endpoint: 'http://h:8100', model: m}, {endpoint: 'http://h:8100/', model: m}]",
            "deployments.primary.replicas[1]: endpoint http://h:8100/ is already replicas[0]",
        ),
    ],
)
def test_bad_endpoint_replicas_are_refused_in_one_line_before_anything_starts(
    placement: str, problem: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from vllm_srun.app import front_server

    def started(*args: object, **kwargs: object) -> None:
        raise AssertionError("the front started preparing workers for a refused config")

    monkeypatch.setattr(front_server, "prepare_front", started)
    config = tmp_path / "bad.yaml"
    config.write_text(
        f"global:\n  model_catalog:\n    deployments:\n      primary:\n        artifact: a\n        {placement}\n"
    )
    assert refusal(["serve", "--config", str(config)], capsys).startswith(f"vllm-sr: error: {problem}")


def test_a_window_the_worker_refuses_is_refused_by_the_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "window.yaml"  # one bound for the config and the worker: at most 10 s
    config.write_text(
        "global:\n  model_catalog:\n    deployments:\n      primary:\n        artifact: a\n"
        "        device: cpu\n        batch_window_ms: 20000\n"
    )
    line = refusal(["serve", "--config", str(config), "--port", "0"], capsys)
    assert line == "vllm-sr: error: deployments.primary.batch_window_ms: expected a number <= 10000.0, got 20000"


def test_worker_settings_the_worker_refuses_stop_the_front_before_any_worker() -> None:
    from vllm_srun.adapters.config.schema import ConfigError, DeploymentConfig, FrontConfig
    from vllm_srun.app.front_server import prepare_front

    config = FrontConfig()  # built in code, so nothing validated it yet
    config.deployments["primary"] = DeploymentConfig(artifact="a", device="cpu", batch_window_ms=20_000.0)
    config.deployments["other"] = DeploymentConfig(artifact="b", device="cuda:0", dtype="fp8")
    with pytest.raises(ConfigError) as refused:
        prepare_front(config, host="127.0.0.1", port=0, max_request_bytes=1024, env={})
    assert refused.value.problems == [
        "deployments.primary: batch_window_ms must be between 0 and 10000 (got 20000.0)",
        "deployments.other: dtype must be one of auto, float32, bfloat16, float16 (got 'fp8')",
    ]


def test_a_bad_thread_override_is_refused(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("VLLM_SRUN_CPU_THREADS", "many")
    line = refusal(["serve", "tiny", "--platform", "cpu", "--port", "0"], capsys)
    assert "VLLM_SRUN_CPU_THREADS must be a positive integer" in line


def test_a_port_in_use_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = refusal(["serve", "tiny", "--platform", "cpu", "--port", str(port)], capsys)
    assert f"--port {port}" in line


# ---- config migrate through the CLI ---------------------------------------------------------------
OLD = """\
global:
  model_catalog:
    deployments:
      primary:
        provider: candle
        artifact: tiny
        precision: fp32
        batch_size: 16
        use_cpu: true
"""


def test_config_migrate_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(OLD)
    line = refusal(["config", "show", "--config", str(path)], capsys)
    assert f"vllm-sr config migrate {path}" in line
    code, out, err = run(["config", "migrate", str(path)], capsys)
    assert code == 0 and path.read_text() == OLD  # printed, not written
    migrated = load_config_text(out).deployments["primary"]
    assert (migrated.dtype, migrated.max_num_seqs, migrated.device) == ("float32", 16, "cpu")
    assert "precision: fp32 → dtype: float32" in err
    code, out, err = run(["config", "migrate", str(path), "--write"], capsys)
    assert code == 0 and out == "" and "wrote" in err
    doc = primary(shown(["--config", str(path)], capsys))
    assert doc == {
        "provider": "model_runtime",
        "artifact": "tiny",
        "device": "cpu",
        "dtype": "float32",
        "max_num_seqs": 16,
    }
    code, out, err = run(["config", "migrate", str(path)], capsys)
    assert code == 0 and "nothing to migrate" in err and out == path.read_text()


def test_a_migration_that_would_change_meaning_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(OLD.replace("use_cpu: true", "use_cpu: true\n        device: cuda:0"))
    assert "contradicts device" in refusal(["config", "migrate", str(path), "--write"], capsys)
    assert "device: cuda:0" in path.read_text()


# ---- docs ------------------------------------------------------------------------------------------
def test_the_config_example_in_the_docs_loads_and_shows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", DOCS.read_text(), flags=re.DOTALL)
    assert blocks, "docs/front.md has a yaml example"
    for index, block in enumerate(blocks):
        config = load_config_text(block, source=f"docs/front.md[{index}]")
        assert config.deployments
        path = tmp_path / f"example{index}.yaml"
        path.write_text(block)
        doc = shown(["--config", str(path)], capsys)
        assert load_config_text(yaml.safe_dump(doc)) == config


def test_a_package_level_refusal_stops_the_front_before_any_worker(
    encoder_fixture, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    fixture = encoder_fixture("embed")
    line = refusal(["serve", str(fixture), "--platform", "cpu", "--max-model-len", "64", "--port", "0"], capsys)
    assert "deployments.primary: --max-model-len applies to decision models only" in line


@pytest.mark.parametrize(
    "ids, devices",
    [("0", ["rocm:0", "rocm:0"]), ("0,1", ["rocm:0", "rocm:1"])],
)
def test_the_seed_placement_examples(ids: str, devices: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    # `vllm-sr serve vllm-sr/d3-edge -e --platform rocm -dp 2 --device-ids …` (seeds/004)
    doc = primary(shown(["vllm-sr/d3-edge", "-e", "--platform", "rocm", "-dp", "2", "--device-ids", ids], capsys))
    assert doc["replicas"] == [{"device": device} for device in devices]


def test_the_profile_flag_in_both_spellings_writes_the_deployments_profile(capsys: pytest.CaptureFixture[str]) -> None:
    for flag in ("--profile", "--runtime-profile"):  # the latter is upstream's front's spelling
        doc = shown(["tiny", "--platform", "cpu", flag, "batching"], capsys)
        assert primary(doc)["profile"] == "batching"
    line = refusal(["config", "show", "tiny", "--profile", "exact", "--enable-shared-context"], capsys)
    assert line.endswith(
        "--enable-shared-context contradicts profile exact, which never shares a decision model's "
        "context (use profile shared_context or max_speed)"
    )
