"""One bound per setting (R-ARG-2): the config, both CLIs and `EngineArgs` accept exactly what
`domain/settings/bounds.py` accepts, refusals are one line, and `--help` says each flag's default."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vllm_srun.adapters.config.declarations import Declared, by_setting
from vllm_srun.adapters.config.loader import validate_config_data
from vllm_srun.adapters.config.settings import WorkerSettings
from vllm_srun.adapters.engines.registry import AUTO, installed_engines
from vllm_srun.app import cli, front_cli
from vllm_srun.domain.security.connections import ConnectionLimits
from vllm_srun.domain.settings import bounds
from vllm_srun.domain.settings.dtypes import DTYPES
from vllm_srun.domain.settings.engine_args import EngineArgs

# settings a deployment, `vllm-sr serve` and (all but timeout_ms) `vllm-srun serve` share
SHARED = (
    bounds.MAX_NUM_SEQS,
    bounds.MAX_NUM_BATCHED_TOKENS,
    bounds.BATCH_WINDOW_MS,
    bounds.MAX_MODEL_LEN,
    bounds.RESULT_CACHE_ENTRIES,
    bounds.MAX_REQUEST_TOKENS,
    bounds.TIMEOUT_MS,
)
# the connection settings: flags of both CLIs' `serve` (not config fields: they guard a listener)
CONNECTIONS = tuple(setting for setting, _ in ConnectionLimits().valued())
ENGINE_ARGS = ("max_num_seqs", "max_num_batched_tokens", "batch_window_ms", "max_model_len")


def parses(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[bool, str]:
    """Whether argparse takes `argv`, and what it wrote to stderr."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            parser.parse_args(argv)
        except SystemExit as exit_:
            assert exit_.code == 2
            return False, err.getvalue()
    return True, err.getvalue()


def config_takes(name: str, value: object) -> bool:
    deployment = {"artifact": "a", name: value}
    return validate_config_data({"global": {"model_catalog": {"deployments": {"p": deployment}}}}) == []


def around(setting: bounds.IntSetting[Any] | bounds.FloatSetting[Any]) -> st.SearchStrategy[float]:
    """Values on, next to and far from a setting's bounds."""
    edges = [edge for edge in (setting.low, setting.high) if edge is not None]
    near = st.sampled_from(edges).flatmap(lambda edge: st.sampled_from([edge - 1, edge, edge + 1]))
    return near | st.integers(-(10**6), 10**6)


@pytest.mark.parametrize("setting", SHARED, ids=lambda setting: setting.name)
@given(data=st.data())
def test_config_clis_and_engine_args_share_each_bound(setting: Any, data: st.DataObject) -> None:
    value = data.draw(around(setting))
    if isinstance(setting, bounds.FloatSetting):
        value = float(value) + data.draw(st.sampled_from([0.0, 0.5, -0.5]))
    allowed = setting.accepts(value)
    assert config_takes(setting.name, value) == allowed
    flag = f"{setting.flag}={value}"
    assert parses(front_cli.build_parser(), ["config", "show", flag])[0] == allowed
    if setting is not bounds.TIMEOUT_MS:
        assert parses(cli.build_parser(), ["serve", flag])[0] == allowed
    if setting.name in ENGINE_ARGS:
        assert (EngineArgs(**{setting.name: value}).problems() == []) == allowed


@pytest.mark.parametrize("setting", CONNECTIONS, ids=lambda setting: setting.name)
@given(data=st.data())
def test_both_servers_share_each_connection_bound(setting: Any, data: st.DataObject) -> None:
    value = data.draw(around(setting))
    if isinstance(setting, bounds.FloatSetting):
        value = float(value) + data.draw(st.sampled_from([0.0, 0.05, -0.05]))
    allowed = setting.accepts(value)
    assert parses(cli.build_parser(), ["serve", f"{setting.flag}={value}"])[0] == allowed
    assert parses(front_cli.build_parser(), ["serve", f"{setting.flag}={value}"])[0] == allowed
    field = {s.name: f for (s, _), f in zip(ConnectionLimits().valued(), LIMIT_FIELDS)}[setting.name]
    assert (ConnectionLimits(**{field: value}).problems() == []) == allowed


LIMIT_FIELDS = ("header_timeout_s", "keep_alive_timeout_s", "body_timeout_s", "max_header_bytes", "max_connections")


@pytest.mark.parametrize("value", ["auto", "float32", "bfloat16", "float16", "fp8", "Float32", ""])
def test_dtype_choices_are_one_list(value: str) -> None:
    allowed = value in bounds.DTYPE.choices
    assert bounds.DTYPE.choices == DTYPES
    assert config_takes("dtype", value) == allowed
    assert (EngineArgs(dtype=value).problems() == []) == allowed
    for parser, argv in ((cli.build_parser(), ["serve"]), (front_cli.build_parser(), ["config", "show"])):
        assert parses(parser, [*argv, f"--dtype={value}"])[0] == allowed


@pytest.mark.parametrize(
    ("device", "worker", "replica"),
    [
        ("cpu", True, True),
        ("auto", True, True),
        ("mps", True, True),
        ("cuda:0", True, True),
        ("rocm:12", True, True),
        ("cuda", True, False),
        ("rocm", True, False),
        ("gpu", False, False),
        ("cuda:", False, False),
        ("cuda:-1", False, False),
        ("CPU", False, False),
        ("cpu ", False, False),
    ],
)
def test_device_spellings(device: str, worker: bool, replica: bool) -> None:
    # a worker may be told `cuda` (its first GPU); a config names each replica's GPU
    assert parses(cli.build_parser(), ["serve", f"--device={device}"])[0] == worker
    assert bounds.DEVICE.accepts(device) == worker
    assert config_takes("device", device) == replica == bounds.REPLICA_DEVICE.accepts(device)


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["--batch-window-ms", "10001"],
            "argument --batch-window-ms: expected a number between 0 and 10000, got 10001",
        ),
        (["--batch-window-ms", "nan"], "argument --batch-window-ms: expected a number between 0 and 10000, got nan"),
        (["--max-num-batched-tokens", "7"], "argument --max-num-batched-tokens: expected an integer >= 8, got 7"),
        (["--max-num-seqs", "many"], "argument --max-num-seqs: expected an integer >= 1, got 'many'"),
        (["--port", "65536"], "argument --port: expected an integer between 0 and 65535, got 65536"),
        (["--device", "xpu"], "argument --device: expected one of cpu, auto, mps, cuda[:N], rocm[:N], got 'xpu'"),
    ],
)
def test_worker_refusals_are_one_line_with_exit_status_2(argv: list[str], line: str) -> None:
    taken, err = parses(cli.build_parser(), ["serve", *argv])
    assert not taken and err == f"vllm-srun serve: error: {line}\n"


def test_help_says_what_each_flag_does_and_its_default() -> None:
    def help_of(parser: argparse.ArgumentParser, argv: list[str]) -> str:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
            parser.parse_args([*argv, "--help"])
        return " ".join(out.getvalue().split())

    worker = help_of(cli.build_parser(), ["serve"])
    for field in cli.SERVE_SETTINGS:
        if field.setting is bounds.ENGINE:  # the installed engines, not a list of the domain's
            assert cli.engine_help(installed_engines()) in worker
        else:
            assert field.help_text() in worker, field.name
    front = help_of(front_cli.build_parser(), ["serve"])
    for field in (*front_cli.DEPLOYMENT_SETTINGS, *front_cli.CONNECTION_FLAGS, worker_field(bounds.MAX_REQUEST_BYTES)):
        assert field.help_text() in front, field.name
    assert front_cli.FRONT_PORT_HELP in front
    assert "(default: 2)" in worker_field(bounds.BATCH_WINDOW_MS).help_text()
    assert "(default: 8 MiB)" in worker_field(bounds.MAX_REQUEST_BYTES).help_text()
    assert "(default: by device class)" in worker_field(bounds.MAX_NUM_SEQS).help_text()


def worker_field(setting: Any) -> Declared:
    return by_setting(WorkerSettings, setting)


def test_problems_are_one_line_each_in_order() -> None:
    checks = [(bounds.MAX_NUM_SEQS, 0), (bounds.DTYPE, "auto"), (bounds.PORT, 70_000), (bounds.THREADS, None)]
    assert bounds.problems(checks) == [
        "max_num_seqs must be >= 1 (got 0)",
        "port must be between 0 and 65535 (got 70000)",
    ]
    assert bounds.MAX_NUM_SEQS.problem(True) == "max_num_seqs must be >= 1 (got True)"  # not a count


def test_every_installed_engine_name_is_spelled_as_the_domain_says() -> None:
    """The domain knows how an engine's name is spelled; which ones exist is the registry's."""
    assert bounds.ENGINE.default == AUTO
    assert all(bounds.ENGINE.accepts(name) for name in installed_engines().choices())
    assert {"native", "onnxruntime"} <= set(installed_engines().names())


def _every_argument(parser: argparse.ArgumentParser, argv: list[str]) -> Iterator[tuple[str, str, str]]:
    """(command, argument, help) of every argument the `--help` of each command lists, as a user
    reads it: under each heading ("options:", a group's title), an argument starts a line indented
    by two, its help follows two spaces on or wraps onto deeper lines; `{a,b}` lists subcommands."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        parser.parse_args([*argv, "--help"])
    entries: list[list[str]] = []
    listed = False
    for line in out.getvalue().splitlines():
        if line[:1].strip():  # a heading, the usage or the description
            listed = line.endswith(":")
        elif listed and line.strip():
            if re.match(r"  \S", line):
                entries.append([*re.split(r"\s{2,}", line.strip(), maxsplit=1), ""][:2])
            else:
                joint = "" if entries[-1][1].endswith("-") else " "  # wrapped at a space or after a hyphen
                entries[-1][1] = f"{entries[-1][1]}{joint}{line.strip()}".strip()
    command = " ".join([parser.prog, *argv])
    for argument, help_text in entries:
        if argument.startswith("{"):
            for name in argument.strip("{}").split(","):
                yield from _every_argument(parser, [*argv, name])
        elif argument != "-h, --help":
            yield command, argument, help_text


@pytest.mark.parametrize("parser", [cli.build_parser(), front_cli.build_parser()], ids=["vllm-srun", "vllm-sr"])
def test_every_flag_of_every_command_says_what_it_does_and_its_default(parser: argparse.ArgumentParser) -> None:
    arguments = list(_every_argument(parser, []))
    assert any(argument.startswith("--") for _, argument, _ in arguments)
    for command, argument, help_text in arguments:
        what = f"{command} {argument}"
        assert len(help_text) > 10, what
        if argument.startswith("-"):  # a flag: its default in words, like vLLM's CLI
            assert "(default: " in help_text or "(required" in help_text, what
