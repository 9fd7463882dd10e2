"""Engine names come from the plugin registry (issue 22 item 4): `--engine` (both CLIs), a
deployment's `engine` and the models file take `auto` and every installed engine plugin, an
unknown name is refused in one line naming the installed ones (`EngineRegistry.unknown`, the one
place that says it), and what an engine refuses whatever the model is its plugin's to say
(`SettingsPreflight`): ONNX Runtime's rules live in its plugin and nowhere else.

`acme` (`tests/plugin_engine.py`) stands for a plugin of another distribution; the end-to-end
proof with it installed as a distribution is `tests/e2e/test_plugin_engine_e2e.py`.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
from pathlib import Path

import pytest

from tests.fakes import FakeDevice
from tests.plugin_engine import AcmeEnginePlugin
from vllm_srun.adapters.config.loader import load_config_text
from vllm_srun.adapters.config.model_args import ModelArgs
from vllm_srun.adapters.config.models_file import load_models_file
from vllm_srun.adapters.config.overrides import apply_cli_overrides
from vllm_srun.adapters.config.schema import ConfigError, FrontConfig
from vllm_srun.adapters.config.settings import WorkerSettings
from vllm_srun.adapters.contracts import EngineRefused, EngineRequest, EngineSettings, SettingRefusal, quiet
from vllm_srun.adapters.engines.plugins import NativePlugin, OnnxRuntimePlugin
from vllm_srun.adapters.engines.registry import EngineRegistry, installed_engines
from vllm_srun.adapters.plugins import ENGINES_GROUP, PluginInfo
from vllm_srun.app import cli, front_cli
from vllm_srun.domain.settings import bounds
from vllm_srun.domain.settings.dtypes import dtype_refusal

ACME = PluginInfo(ENGINES_GROUP, "acme", "acme-engines", "1.0")
SRC = Path(__file__).resolve().parents[2] / "src"


def with_acme() -> EngineRegistry:
    """The installed engines plus `acme`, as if its distribution were installed."""
    return EngineRegistry(engines={"acme": (ACME, AcmeEnginePlugin())})


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[argparse.Namespace | None, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            return parser.parse_args(argv), err.getvalue()
        except SystemExit as exit_:
            assert exit_.code == 2
    return None, err.getvalue()


def help_text(parser: argparse.ArgumentParser, argv: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        parser.parse_args([*argv, "--help"])
    return " ".join(out.getvalue().split())


def deployment(fields: str) -> str:
    return f"global:\n  model_catalog:\n    deployments:\n      primary:\n        artifact: a\n{fields}"


# ---- the one membership check ------------------------------------------------------------------
def test_an_unknown_name_is_refused_in_one_line_naming_the_installed_engines() -> None:
    engines = with_acme()
    line = "unknown engine 'turbo': installed are native, onnxruntime, acme (or auto)"
    assert engines.unknown("turbo") == line
    assert [engines.unknown(name) for name in ("auto", "native", "onnxruntime", "acme")] == [None] * 4
    with pytest.raises(EngineRefused) as refused:
        engines.resolve_name("turbo")
    assert str(refused.value) == line
    assert installed_engines().unknown("acme") == "unknown engine 'acme': installed are native, onnxruntime (or auto)"


def test_the_domain_spells_a_name_and_leaves_membership_to_the_registry() -> None:
    assert all(bounds.ENGINE.accepts(name) for name in with_acme().choices())
    assert bounds.ENGINE.accepts("someone-elses.engine_2")  # not installed, but spelled right
    assert not any(bounds.ENGINE.accepts(bad) for bad in ("", "a b", "-x", "x=y", 3))
    settings = WorkerSettings(engine="acme")
    assert settings.problems() == [] and "--engine=acme" in settings.to_argv()
    assert WorkerSettings(engine="a b").problems() == [
        "engine must be auto or an installed engine's name (letters, digits, '.', '_' or '-') (got 'a b')"
    ]


# ---- the CLIs ----------------------------------------------------------------------------------
def test_the_worker_cli_takes_every_installed_engine_and_refuses_others_in_one_line() -> None:
    parser = cli.build_parser(with_acme())
    for name in ("auto", "native", "onnxruntime", "acme"):
        ns, _ = parse(parser, ["serve", "--engine", name])
        assert ns is not None and ns.engine == name
    ns, err = parse(parser, ["serve", "--engine", "turbo"])
    assert ns is None and err == (
        "vllm-srun serve: error: argument --engine: "
        "unknown engine 'turbo': installed are native, onnxruntime, acme (or auto)\n"
    )
    ns, err = parse(cli.build_parser(installed_engines()), ["serve", "--engine", "acme"])
    assert ns is None and "unknown engine 'acme'" in err and err.count("\n") == 1
    assert "or an installed engine: native, onnxruntime, acme (default: auto)" in help_text(parser, ["serve"])


def test_the_front_cli_lists_the_installed_engines() -> None:
    shown = help_text(front_cli.build_parser(with_acme()), ["serve"])
    assert "the runtime engine: auto (the first installed engine that serves the model, native first)" in shown
    assert "or an installed engine: native, onnxruntime, acme" in shown


def test_front_flags_take_a_plugin_engine_and_refuse_an_unknown_one() -> None:
    engines = with_acme()
    config = apply_cli_overrides(FrontConfig(), model="m", engine="acme", engines=engines)
    assert config.deployments["primary"].engine == "acme"
    with pytest.raises(ConfigError) as refused:
        apply_cli_overrides(FrontConfig(), model="m", engine="turbo", engines=engines)
    assert refused.value.problems == [
        "--engine: unknown engine 'turbo': installed are native, onnxruntime, acme (or auto)"
    ]


# ---- the deployment config and the models file -------------------------------------------------
def test_a_deployment_names_any_installed_engine() -> None:
    engines = with_acme()
    assert (
        load_config_text(deployment("        engine: acme\n"), engines=engines).deployments["primary"].engine == "acme"
    )
    with pytest.raises(ConfigError) as refused:
        load_config_text(deployment("        engine: acme\n"))  # not installed here
    assert refused.value.problems == [
        "deployments.primary.engine: unknown engine 'acme': installed are native, onnxruntime (or auto)"
    ]
    with pytest.raises(ConfigError) as refused:  # the plugin's own rule, in the config's words
        load_config_text(deployment("        engine: acme\n        dtype: bfloat16\n"), engines=engines)
    assert refused.value.problems == [
        "deployments.primary.dtype: the acme engine runs float32 only (dtype auto or float32)"
    ]
    load_config_text(deployment("        engine: acme\n        dtype: float32\n"), engines=engines)


@pytest.mark.parametrize(
    ("engine", "problem"),
    [
        ("acme", "models[1].dtype: the acme engine runs float32 only (dtype auto or float32)"),
        ("onnxruntime", "models[1].dtype: the onnxruntime engine runs only dtype auto"),
        ("native", None),
        ("auto", None),  # another engine may serve
    ],
)
def test_a_models_file_is_checked_against_the_workers_engine_plugin(
    engine: str, problem: str | None, tmp_path: Path
) -> None:
    path = tmp_path / "models.yaml"
    path.write_text("models:\n  - artifact: a\n  - artifact: b\n    dtype: bfloat16\n", encoding="utf-8")

    def load() -> list[object]:
        return list(
            load_models_file(
                path,
                flags=ModelArgs(engine=engine, max_queue=8, max_queued_tokens=1024),
                device="cpu",
                dtype_refusal=dtype_refusal,
                engines=with_acme(),
            )
        )

    if problem is None:
        assert len(load()) == 2
        return
    with pytest.raises(ConfigError) as refused:
        load()
    assert refused.value.problems == [f"{path}: {problem}"]


# ---- what an engine refuses is its plugin's to say -----------------------------------------------
@pytest.mark.parametrize(
    ("engine", "settings", "line"),
    [
        (
            "onnxruntime",
            EngineSettings(dtype="bfloat16"),
            "--dtype bfloat16: the onnxruntime engine runs only dtype auto",
        ),
        (
            "onnxruntime",
            EngineSettings(dtype="float32"),
            "--dtype float32: the onnxruntime engine runs only dtype auto",
        ),
        (
            "onnxruntime",
            EngineSettings(deterministic=True),
            "--deterministic: the onnxruntime engine cannot answer bit-identically in any batch; use --engine native",
        ),
        ("onnxruntime", EngineSettings(), None),
        (
            "acme",
            EngineSettings(deterministic=True),
            "--deterministic: the acme engine promises no bit-identical answers",
        ),
        ("acme", EngineSettings(dtype="float32"), None),
        ("native", EngineSettings(dtype="bfloat16", deterministic=True), None),  # no SettingsPreflight: refuses none
        ("auto", EngineSettings(dtype="bfloat16", deterministic=True), None),  # another engine may serve
    ],
)
def test_the_flag_refusal_is_the_plugins_one_line(engine: str, settings: EngineSettings, line: str | None) -> None:
    assert with_acme().flag_refusal(engine, settings) == line


def test_the_onnxruntime_plugin_says_what_it_refuses() -> None:
    plugin = OnnxRuntimePlugin()
    assert plugin.settings_refusal(EngineSettings(dtype="float16")) == SettingRefusal(
        "dtype", "the onnxruntime engine runs only dtype auto"
    )
    assert plugin.settings_refusal(EngineSettings()) is None
    assert not hasattr(NativePlugin(), "settings_refusal")
    # a container built in code skips the CLIs: the plugin refuses before anything is exported
    request = EngineRequest("encoder", object(), FakeDevice(), deterministic=True)
    with pytest.raises(EngineRefused) as refused:
        plugin.build(request, quiet)
    assert str(refused.value).startswith("the onnxruntime engine cannot answer bit-identically in any batch")


def test_no_module_but_the_onnxruntime_plugin_compares_an_engine_name_with_onnxruntime() -> None:
    """`if engine == "onnxruntime"` outside the plugin is how a plugin's rule leaks into the core."""
    allowed = {SRC / "adapters/engines" / name for name in ("plugins.py", "onnxruntime.py", "onnx_export.py")}
    found = [
        f"{path.relative_to(SRC)}:{node.lineno}"
        for path in sorted(SRC.rglob("*.py"))
        if path not in allowed
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Compare)
        and any(
            isinstance(side, ast.Constant) and side.value == "onnxruntime" for side in (node.left, *node.comparators)
        )
    ]
    assert found == []
