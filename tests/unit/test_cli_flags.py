"""The command lines of both CLIs as a user with other CLIs' habits meets them: no flag is taken
by an abbreviation (`--model` is not `--models`, `--api-key` not `--api-key-file`), and an
unrecognized flag is refused in one line naming the flag it probably meant; the flags issue 45
adds (naming, Hub, budget, retries) read into the settings record and refuse one line each."""

from __future__ import annotations

import argparse
import contextlib
import io
from collections.abc import Iterator

import pytest

from vllm_srun.adapters.config.domain_values import split_revision
from vllm_srun.adapters.config.schema import DeploymentConfig
from vllm_srun.adapters.config.settings import WorkerSettings
from vllm_srun.adapters.workers.command import hub_target, worker_settings
from vllm_srun.adapters.workers.compat import card_problem
from vllm_srun.app import cli, front_cli
from vllm_srun.app.flags import did_you_mean
from vllm_srun.domain.errors import ModelNotFound

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def every_parser(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from every_parser(sub)


def refusal(parser: argparse.ArgumentParser, argv: list[str]) -> str:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exited:
        parser.parse_args(argv)
    assert exited.value.code == 2
    lines = err.getvalue().strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("parser", [cli.build_parser(), front_cli.build_parser()], ids=["vllm-srun", "vllm-sr"])
def test_no_parser_takes_abbreviations(parser: argparse.ArgumentParser) -> None:
    parsers = list(every_parser(parser))
    assert len(parsers) > 3 and all(not p.allow_abbrev for p in parsers), [p.prog for p in parsers if p.allow_abbrev]


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["serve", "--model", "X"], "vllm-srun: error: unrecognized arguments: --model (did you mean --models?)"),
        (["serve", "m", "--model", "X"], "unrecognized arguments: --model X (did you mean --models?)"),
        (["serve", "--api-key", "abc"], "unrecognized arguments: --api-key (did you mean --api-key-file?)"),
        (
            ["serve", "m", "--max-num-seq", "4"],
            "unrecognized arguments: --max-num-seq 4 (did you mean --max-num-seqs?)",
        ),
        (["serve", "m", "--max-batch-tokens=9"], "(did you mean --max-num-batched-tokens?)"),
        (["serve", "m", "--gpu-memory-utilization", "0.9"], "unrecognized arguments: --gpu-memory-utilization 0.9"),
        (
            ["serve", "m", "--model=a", "--api-key", "b"],
            "(did you mean --models for --model, --api-key-file for --api-key?)",
        ),
        (["batch", "in", "out", "--modle", "m"], "unrecognized arguments: --modle m (did you mean --model?)"),
        (["key", "add", "t", "--api-key-file", "f", "--weigh", "2"], "(did you mean --weight?)"),
    ],
)
def test_the_worker_cli_suggests_the_flag_meant(argv: list[str], line: str) -> None:
    got = refusal(cli.build_parser(), argv)
    assert line in got, got
    if "gpu-memory" in line:
        assert "did you mean" not in got  # nothing close: no guess


def test_the_front_cli_suggests_the_flag_meant() -> None:
    got = refusal(front_cli.build_parser(), ["serve", "--api-key", "abc"])
    assert got == "vllm-sr: error: unrecognized arguments: --api-key (did you mean --api-key-file?)"
    got = refusal(front_cli.build_parser(), ["serve", "--data-parallel", "2"])
    assert "(did you mean --data-parallel-size?)" in got


def test_did_you_mean() -> None:
    options = ["--models", "--api-key-file", "--max-num-seqs", "--device", "-h", "--help"]
    assert did_you_mean("--model", options) == "--models"  # what the abbreviation would have meant
    assert did_you_mean("--devcie", options) == "--device"  # a misspelling
    assert did_you_mean("--zzz", options) is None
    assert did_you_mean("--he", options) is None  # --help is never the guess


def parsed(*argv: str) -> WorkerSettings:
    return cli.serve_settings(cli.build_parser().parse_args(["serve", *argv]))


def test_the_new_serve_flags_read_into_the_settings_record() -> None:
    settings = parsed(
        "acme/tiny",
        "--revision=v1.0",
        "--served-model-name=embedder",
        "--family=encoder",
        "--memory-budget=2.5",
        "--offline",
        "--cache-dir=/tmp/hf",
        "--load-attempts=3",
        "--load-retry-seconds=0.5",
    )
    assert (settings.revision, settings.served_model_name, settings.family) == ("v1.0", "embedder", "encoder")
    assert (settings.memory_budget_gib, settings.offline, settings.cache_dir) == (2.5, True, "/tmp/hf")
    assert (settings.load_attempts, settings.load_retry_seconds, settings.device) == (3, 0.5, "auto")
    assert settings.problems() == []
    (spec,) = settings.model_specs(settings.models)
    assert (spec.artifact, spec.revision, spec.target, spec.served_name) == (
        "acme/tiny",
        "v1.0",
        "acme/tiny@v1.0",
        "embedder",
    )
    assert (spec.family, spec.memory_budget_gib) == ("encoder", 2.5)
    assert parsed(*settings.to_argv()[1:]) == settings  # the worker reads its own command line back
    assert (
        parsed().device == "auto" and WorkerSettings().load_attempts == 5 and WorkerSettings().load_retry_seconds == 5
    )


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--load-attempts", "0"], "argument --load-attempts: expected an integer between 1 and 100, got 0"),
        (["--load-retry-seconds", "301"], "argument --load-retry-seconds: expected a number between 0 and 300"),
        (["--memory-budget", "0"], "argument --memory-budget: expected a number between 1e-06 and 1000000, got 0"),
        (["--revision", "-x"], "argument --revision: expected one argument"),
        (["--revision", "a b"], "argument --revision: expected a branch, a tag or a 40-hex commit"),
        (["--family", "a b"], "argument --family: expected an installed family's name"),
        (["--served-model-name", "a b"], "argument --served-model-name: expected a name of at most 256 characters"),
    ],
)
def test_bad_values_are_one_line(argv: list[str], line: str) -> None:
    got = refusal(cli.build_parser(), ["serve", "m", *argv])
    assert line in got, got


def test_one_model_flags_name_one_model() -> None:
    assert parsed("a", "b", "--served-model-name=x").problems() == [
        "--served-model-name applies to one MODEL argument (2 given)"
    ]
    assert parsed("--models=f.yaml", "--revision=main").problems() == [
        "--revision applies to one MODEL argument; with --models FILE each entry sets its revision"
    ]
    assert parsed("--revision=main").problems() == [
        "--revision applies to a Hugging Face id MODEL (ORG/NAME); none is given"
    ]
    assert parsed("--served-model-name=x").problems() == []  # names the built-in default model


def test_a_hub_id_and_its_revision() -> None:
    assert split_revision("acme/x@v2") == ("acme/x", "v2")
    assert split_revision("acme/x", "v2") == ("acme/x", "v2")
    assert split_revision("acme/x@v2", "v2") == ("acme/x", "v2")  # said twice alike: fine
    assert split_revision("all-MiniLM-L6-v2") == ("all-MiniLM-L6-v2", None)
    with pytest.raises(ModelNotFound, match="names revision v2 and --revision names v3: give one"):
        split_revision("acme/x@v2", "v3")
    with pytest.raises(ModelNotFound, match="all-MiniLM-L6-v2 is not a Hugging Face id"):
        split_revision("all-MiniLM-L6-v2", "main")
    (spec,) = WorkerSettings(models=("acme/x@" + COMMIT,)).model_specs(("acme/x@" + COMMIT,))
    assert (spec.artifact, spec.revision, spec.served_name) == ("acme/x", COMMIT, "x")


def test_a_deployments_hub_revision_reaches_its_workers() -> None:
    hub = worker_settings(DeploymentConfig(artifact="acme/tiny", revision="v1.0"), device="cpu", uds="/s", threads=1)
    assert "--revision=v1.0" in hub.to_argv() and hub.problems() == []
    assert hub_target("acme/tiny", "v1.0") == "acme/tiny@v1.0"
    # a folder's revision only pins what the card reports (compat): the worker gets no --revision
    folder = worker_settings(DeploymentConfig(artifact="/srv/m", revision=COMMIT), device="cpu", uds="/s", threads=1)
    assert not any(arg.startswith("--revision") for arg in folder.to_argv())
    assert hub_target("/srv/m", COMMIT) == "/srv/m" and hub_target("acme/tiny", None) == "acme/tiny"


def test_a_branch_is_not_compared_with_the_commit_a_card_reports() -> None:
    card = {"revision": COMMIT, "engine_args": {}}
    assert card_problem(card, DeploymentConfig(artifact="acme/tiny", revision="main"), None) is None
    other = "f" * 40
    assert "but the deployment pins" in (
        card_problem(card, DeploymentConfig(artifact="acme/tiny", revision=other), None) or ""
    )


def test_a_models_file_takes_hub_ids_and_the_per_model_flags(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from vllm_srun.adapters.config.model_args import ModelArgs
    from vllm_srun.adapters.config.models_file import load_models_file
    from vllm_srun.adapters.config.schema import ConfigError
    from vllm_srun.domain.settings.dtypes import dtype_refusal

    path = tmp_path / "models.yaml"
    path.write_text("models:\n  - model: acme/x@v1\n  - {model: acme/y, family: decision, memory_budget_gib: 3}\n")
    flags = ModelArgs(family="encoder", memory_budget_gib=1.5)  # `--family`, `--memory-budget`: every entry's default
    first, second = load_models_file(path, flags=flags, device="cpu", dtype_refusal=dtype_refusal)
    assert (first.artifact, first.revision, first.served_name, first.family, first.memory_budget_gib) == (
        "acme/x",
        "v1",
        "x",
        "encoder",
        1.5,
    )
    assert (second.artifact, second.revision, second.family, second.memory_budget_gib) == (
        "acme/y",
        None,
        "decision",
        3,
    )
    path.write_text(f"models:\n  - {{model: acme/x@v1, revision: {COMMIT}}}\n")
    with pytest.raises(ConfigError) as refused:
        load_models_file(path, flags=ModelArgs(), device="cpu", dtype_refusal=dtype_refusal)
    assert refused.value.problems == [f"{path}: models[0]: revision: acme/x@v1 names its revision already; give one"]


def test_the_front_checks_a_hub_deployment_at_its_revision_offline(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from vllm_srun.adapters.config.loader import load_config_text
    from vllm_srun.app.bootstrap import bootstrap_front
    from vllm_srun.app.front_server import _check_packages

    config = load_config_text(
        "global:\n  model_catalog:\n    deployments:\n      primary:\n"
        "        artifact: acme/not-cached\n        revision: v1.0\n        device: cpu\n",
        source="front.yaml",
    )
    container = bootstrap_front(config, socket_dir=str(tmp_path), hub_cache=str(tmp_path / "hf"), offline=True)
    assert container.store().hub.offline and container.store().hub.cache_dir == tmp_path / "hf"
    with pytest.raises(ValueError) as refused:
        _check_packages(config, container)
    line = str(refused.value)
    assert line.startswith("deployments.primary: acme/not-cached@v1.0 is not in the Hugging Face cache"), line
    assert "offline" in line and "\n" not in line


def test_the_front_takes_offline_and_a_cache_dir() -> None:
    ns = front_cli.build_parser().parse_args(["serve", "acme/tiny", "--offline", "--cache-dir", "/tmp/hf"])
    assert (ns.offline, ns.cache_dir) == (True, "/tmp/hf")
