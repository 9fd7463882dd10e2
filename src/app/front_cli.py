"""`vllm-sr`: the deployment front (R-REP, R-ARG).

    vllm-sr serve [MODEL] [-e [ENGINE]] [--platform P] [-dp N] [--device-ids 0,1] [--config FILE]
                  [--host 127.0.0.1] [--port 8000] [engine args]
    vllm-sr config show [--config FILE] [the same flags]
    vllm-sr config migrate FILE [--write]

Flags write the same canonical config a file holds (`adapters/config/overrides.py`);
`config show` prints what `serve` would run. Every refusal is one line on stderr and exit
status 2, before any worker starts.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from vllm_srun.adapters.config.declarations import by_setting, declared
from vllm_srun.adapters.config.domain_values import CONNECTION_SETTINGS
from vllm_srun.adapters.config.schema import ENGINE_ARG_FIELDS, DeploymentConfig
from vllm_srun.adapters.config.settings import WorkerSettings
from vllm_srun.adapters.engines.registry import EngineRegistry, installed_engines
from vllm_srun.adapters.plugins import PluginConflict
from vllm_srun.app.flags import OneLineParser, add_flag, add_setting, positive_int
from vllm_srun.domain.settings import bounds

PROG = "vllm-sr"
FRONT_PORT_HELP = f"the TCP port to listen on; workers use Unix sockets (default: {bounds.FRONT_PORT.default})"
PID_FILE_HELP = (
    "the file that names the front's pid, host and port, for `vllm-sr reload` "
    "(default: $XDG_RUNTIME_DIR/vllm-sr/PORT.json, else <tmp>/vllm-sr-UID/PORT.json)"
)
ENGINE_MODE = ""  # `-e` without a value: Engine mode, the only mode this front has


def refuse(message: str) -> NoReturn:
    print(f"{PROG}: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def _device_ids(text: str) -> list[int]:
    try:
        ids = [int(part) for part in text.split(",") if part.strip() != ""]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected GPU indices such as 0,1, got {text!r}") from None
    if not ids:
        raise argparse.ArgumentTypeError(f"expected GPU indices such as 0,1, got {text!r}")
    return ids


# Flags written into the default deployment of the config (its declared fields but the engine);
# unset ones are not written, so the config's value (or the worker's default) stays.
DEPLOYMENT_SETTINGS = tuple(d for d in declared(DeploymentConfig) if d.name in ENGINE_ARG_FIELDS)
# the front's own listener, the same flags as the worker's (docs/hardening.md)
CONNECTION_FLAGS = tuple(by_setting(WorkerSettings, setting) for setting in CONNECTION_SETTINGS)


def _add_config_flags(p: argparse.ArgumentParser, engines: EngineRegistry) -> None:
    from vllm_srun.adapters.config.overrides import PLATFORMS

    p.add_argument(
        "model",
        nargs="?",
        metavar="MODEL",
        help="artifact of the default deployment (default: the config's, else all-MiniLM-L6-v2)",
    )
    p.add_argument(
        "-e",
        "--engine",
        nargs="?",
        const=ENGINE_MODE,
        default=None,
        metavar="ENGINE",
        help="Engine mode (serve the model runtime; LLM routing is out of scope); "
        f"with a value, the runtime engine: {engines.choices_text()}; a value that is no engine is the MODEL "
        f"(default: {bounds.ENGINE.default})",
    )
    p.add_argument("--config", metavar="FILE", help="the canonical config (YAML) (default: none, the flags alone)")
    p.add_argument(
        "--platform",
        choices=PLATFORMS,
        default=None,
        help="where the default deployment's workers run (default: as configured, else auto)",
    )
    p.add_argument(
        "-dp",
        "--data-parallel-size",
        type=positive_int,
        default=None,
        metavar="N",
        help="workers of the default deployment (default: as configured, else 1)",
    )
    p.add_argument(
        "--device-ids",
        type=_device_ids,
        default=None,
        metavar="IDS",
        help="GPU indices, e.g. 0,1 (default: the first available GPUs for a new GPU placement)",
    )
    for setting in DEPLOYMENT_SETTINGS:
        # `--runtime-profile`: upstream's front spells the deployment's profile so (R-PROF-3)
        aliases = ("--runtime-profile",) if setting.setting is bounds.PROFILE else ()
        add_setting(p, setting, default=None, aliases=aliases)


def build_parser(engines: EngineRegistry | None = None) -> argparse.ArgumentParser:
    """The `vllm-sr` parser; `--engine`'s help lists ENGINES (default: the installed plugins).
    Raises PluginConflict (one line) when two distributions claim an engine name."""
    engines = engines or installed_engines()
    parser = OneLineParser(prog=PROG, description="The deployment front: workers, dispatch, ejection, inventory.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    serve = sub.add_parser("serve", help="start the workers and serve the deployments over HTTP")
    _add_config_flags(serve, engines)
    add_setting(serve, by_setting(WorkerSettings, bounds.HOST))
    add_flag(serve, bounds.FRONT_PORT, FRONT_PORT_HELP)
    add_setting(serve, by_setting(WorkerSettings, bounds.MAX_REQUEST_BYTES))
    serve.add_argument(
        "--drain-timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="on SIGTERM, how long in-flight requests may take before workers stop (default: %(default)g)",
    )
    add_setting(serve, by_setting(WorkerSettings, bounds.LOG_LEVEL))
    # where Hub id artifacts resolve, for the front's checks and its managed workers (R-PKG-5)
    for hub_setting in (bounds.OFFLINE, bounds.CACHE_DIR):
        add_setting(serve, by_setting(WorkerSettings, hub_setting))
    from vllm_srun.app.keys import add_security_flags

    add_security_flags(serve, worker=False)  # the front's own door (R-AUTH)
    for connection_flag in CONNECTION_FLAGS:
        add_setting(serve, connection_flag)
    add_flag(serve, bounds.PID_FILE, PID_FILE_HELP, metavar="FILE")
    reload = sub.add_parser(
        "reload",
        help="apply the config again on a running `vllm-sr serve` (SIGHUP), without failing a request",
        description="Find the running front through its pid file, send it SIGHUP and wait for the outcome: "
        "it reads its --config file again with the flags it was started with, starts new workers, "
        "publishes the new pool once they are ready, and retires the workers no longer wanted. "
        "Exit status 0: applied; 2: the config was refused (one line per problem; the old one keeps "
        "serving); 1: the new workers did not get ready (nothing changed).",
    )
    add_flag(reload, bounds.FRONT_PORT, f"the port of the front to reload (default: {bounds.FRONT_PORT.default})")
    add_flag(reload, bounds.PID_FILE, "the front's pid file (default: the one of --port)", metavar="FILE")
    add_flag(
        reload,
        bounds.RELOAD_TIMEOUT_S,
        f"seconds `vllm-sr reload` waits for the reload's outcome (default: {bounds.RELOAD_TIMEOUT_S.default:g})",
        metavar="S",
    )
    config = sub.add_parser("config", help="show or migrate the canonical config")
    config_sub = config.add_subparsers(dest="config_command", required=True, parser_class=OneLineParser)
    show = config_sub.add_parser("show", help="print the config `serve` would run, as YAML")
    _add_config_flags(show, engines)
    migrate = config_sub.add_parser("migrate", help="rewrite removed settings (prints, or --write)")
    migrate.add_argument("file", metavar="FILE", help="the config to migrate")
    migrate.add_argument("--write", action="store_true", help="rewrite FILE in place (default: print the result)")
    return parser


def resolve_config(ns: argparse.Namespace):
    """The canonical config: the file (or an empty one), then the flags; refuses on a problem."""
    from vllm_srun.adapters.config.schema import ConfigError

    try:
        return build_config(ns)
    except ConfigError as exc:
        refuse("; ".join(exc.problems))


def build_config(ns: argparse.Namespace):
    """The canonical config of the file and the flags (read again on every reload); raises
    ConfigError with one line per problem."""
    from vllm_srun.adapters.catalog import DEFAULT_MODEL
    from vllm_srun.adapters.config.loader import load_config_file
    from vllm_srun.adapters.config.overrides import GPU_PLATFORMS, apply_cli_overrides
    from vllm_srun.adapters.config.schema import ConfigError, FrontConfig

    model, engine = ns.model, ns.engine
    unknown = None if engine in (None, ENGINE_MODE) else installed_engines().unknown(engine)
    if unknown is not None:
        if model is not None:
            raise ConfigError([f"--engine: {unknown}"])
        model, engine = engine, ENGINE_MODE  # `-e MODEL`: the value was the model
    try:
        config = load_config_file(ns.config) if ns.config else FrontConfig()
    except OSError as exc:
        raise ConfigError([f"--config {ns.config}: {exc.strerror or exc}"]) from None
    if model is None and not config.deployments:
        model = DEFAULT_MODEL  # like `vllm-srun serve`: the embedded default
    platform = ns.platform
    gpus: list[int] = []
    placing = ns.data_parallel_size is not None or ns.device_ids
    if platform in (None, "auto") and placing and _unplaced(config):
        from vllm_srun.adapters.devices.torch_devices import detect_gpus

        platform, gpus = detect_gpus()
    elif platform in GPU_PLATFORMS and not ns.device_ids:
        from vllm_srun.adapters.devices.torch_devices import detect_gpus

        found, ids = detect_gpus()
        gpus = ids if found == platform else []
    args = {field.name: getattr(ns, field.name) for field in DEPLOYMENT_SETTINGS}
    return apply_cli_overrides(
        config,
        model=model,
        engine=engine or None,
        platform=platform,
        data_parallel_size=ns.data_parallel_size,
        device_ids=ns.device_ids,
        engine_args=args,
        available_gpus=gpus,
    )


def _unplaced(config) -> bool:
    """The default deployment has no declared placement yet (the CLI must resolve `auto`)."""
    name = config.default_deployment_name()
    deployment = config.deployments.get(name) if name else None
    return deployment is None or (
        deployment.replicas is None and deployment.endpoint is None and deployment.device in (None, "auto")
    )


def config_show(ns: argparse.Namespace) -> int:
    from vllm_srun.adapters.config.loader import dump_config

    sys.stdout.write(dump_config(resolve_config(ns)))
    return 0


def config_migrate(ns: argparse.Namespace) -> int:
    from vllm_srun.adapters.config.loader import load_config_text
    from vllm_srun.adapters.config.migrate import migrate_config_text
    from vllm_srun.adapters.config.schema import ConfigError

    path = Path(ns.file)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        refuse(f"{ns.file}: {exc.strerror or exc}")
    try:
        migration = migrate_config_text(text)
        load_config_text(migration.text, source=ns.file)  # what is left must load
    except ConfigError as exc:
        refuse("; ".join(exc.problems))
    for change in migration.changes:
        print(f"{PROG}: {change}", file=sys.stderr)
    if not migration.changed:
        print(f"{PROG}: {ns.file}: nothing to migrate", file=sys.stderr)
    if ns.write:
        if migration.changed:
            path.write_text(migration.text, encoding="utf-8")
            print(f"{PROG}: wrote {ns.file}", file=sys.stderr)
    else:
        sys.stdout.write(migration.text)
    return 0


def serve(ns: argparse.Namespace) -> int:
    config = resolve_config(ns)
    from vllm_srun.adapters.config.domain_values import connection_limits
    from vllm_srun.adapters.config.schema import ConfigError
    from vllm_srun.adapters.front.control import default_pid_file
    from vllm_srun.app.front_server import prepare_front, run_front
    from vllm_srun.app.keys import security

    key_file = ns.api_key_file or config.global_.api_key_file  # the flag wins over the config
    env = dict(os.environ)
    if ns.offline:  # the managed workers resolve Hub ids as the front does (huggingface_hub reads these)
        env["HF_HUB_OFFLINE"] = "1"
    if ns.cache_dir:
        env["HF_HUB_CACHE"] = os.path.abspath(os.path.expanduser(ns.cache_dir))
    try:
        door = security(argparse.Namespace(**{**vars(ns), "api_key_file": key_file}), ns.host)  # before any worker
        front = prepare_front(
            config,
            security=door,
            key_file=key_file,
            host=ns.host,
            port=ns.port,
            max_request_bytes=ns.max_request_bytes,
            log_level=ns.log_level,
            env=env,
            hub_cache=ns.cache_dir,
            offline=ns.offline,
            load_config=lambda: build_config(ns),
            pid_file=Path(ns.pid_file) if ns.pid_file else default_pid_file(ns.port),
            connection_limits=connection_limits(ns),
        )
    except ConfigError as exc:  # the workers' settings, one line per problem
        refuse("; ".join(exc.problems))
    except ValueError as exc:  # a refusal found while preparing (threads, packages, port, descriptors)
        refuse(str(exc))
    for warning in front.warnings:
        print(f"{PROG}: warning: {warning}", file=sys.stderr, flush=True)
    return run_front(front, drain_timeout_s=ns.drain_timeout)


def reload(ns: argparse.Namespace) -> int:
    from vllm_srun.adapters.front.control import ReloadError, default_pid_file, reload_front

    path = Path(ns.pid_file) if ns.pid_file else default_pid_file(ns.port)
    try:
        status = reload_front(path, ns.timeout)
    except ReloadError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
        return 1
    if status["state"] == "refused":
        for problem in status["problems"]:
            print(f"{PROG}: error: {problem}", file=sys.stderr, flush=True)
        return 2
    if status["state"] != "done":
        for problem in status["problems"]:
            print(f"{PROG}: error: reload failed, the old config keeps serving: {problem}", file=sys.stderr)
        return 1
    print(
        f"{PROG}: reloaded in {status['seconds']:g} s: kept {', '.join(status['kept']) or 'none'}; "
        f"started {', '.join(status['started']) or 'none'}; retired {', '.join(status['retired']) or 'none'}",
        file=sys.stderr,
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    try:
        parser = build_parser()
    except PluginConflict as exc:  # two distributions claim one engine name
        refuse(str(exc))
    ns = parser.parse_args(argv)
    if ns.command == "serve":
        return serve(ns)
    if ns.command == "reload":
        return reload(ns)
    if ns.config_command == "show":
        return config_show(ns)
    return config_migrate(ns)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
