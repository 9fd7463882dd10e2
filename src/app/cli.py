"""`vllm-srun`: serve models, pull catalog models, list what this install serves (`models`,
`plugins`, `devices`), write fixtures, quantize packages.

Every refusal is one line on stderr and a non-zero exit, before any model loads (R-ARG-2).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import NoReturn

import msgspec

from vllm_srun.adapters.catalog import CATALOG, DEFAULT_MODEL
from vllm_srun.adapters.config.declarations import Declared, by_setting, declared
from vllm_srun.adapters.config.settings import WorkerSettings
from vllm_srun.adapters.engines.registry import EngineRegistry, installed_engines
from vllm_srun.adapters.plugins import PluginConflict
from vllm_srun.app.flags import OneLineParser, add_setting, arg_type, non_negative_int, positive_int
from vllm_srun.domain.settings import bounds
from vllm_srun.domain.settings.dtypes import dtype_refusal
from vllm_srun.domain.worker.adaptive_threads import ADAPTIVE_ENV, Mode, parse_mode
from vllm_srun.domain.worker.threads import (
    OMP_THREADS_ENV,
    WAIT_POLICY_ENV,
    CpuPlan,
    budget_threads,
    concurrent_forwards_refusal,
    default_concurrent_forwards,
    express_forward,
    forward_nice,
    lane_yield,
    omp_wait_policy,
    standalone_threads,
    threads_refusal,
)
from vllm_srun.domain.worker.worker_settings import ModelSpec

PROG = "vllm-srun"
# `serve` flags, in `--help` order: every declared field of the settings record
SERVE_SETTINGS: tuple[Declared, ...] = declared(WorkerSettings)
ENGINE_FIELD = by_setting(WorkerSettings, bounds.ENGINE)


def refuse(message: str) -> NoReturn:
    refuse_all([message])


def refuse_all(problems: Sequence[str]) -> NoReturn:
    """One line per problem on stderr, then exit status 2."""
    for problem in problems:
        print(f"{PROG}: error: {problem}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def engine_name(engines: EngineRegistry) -> Callable[[str], str]:
    """An argparse `type=` for `--engine`: auto or an installed engine plugin's name, else the
    registry's one line naming the installed ones."""

    def convert(text: str) -> str:
        refusal = engines.unknown(text)
        if refusal is not None:
            raise argparse.ArgumentTypeError(refusal)
        return text

    convert.__name__ = bounds.ENGINE.name
    return convert


def engine_help(engines: EngineRegistry) -> str:
    """`--engine`'s help: the installed engines, then the default."""
    return f"{ENGINE_FIELD.help}: {engines.choices_text()} (default: {ENGINE_FIELD.default_text()})"


def build_parser(engines: EngineRegistry | None = None) -> argparse.ArgumentParser:
    """The `vllm-srun` parser; `--engine` takes what ENGINES (default: the installed plugins) holds.
    Raises PluginConflict (one line) when two distributions claim an engine name."""
    engines = engines or installed_engines()
    parser = OneLineParser(prog=PROG, description="Serve non-generative models with cross-request batching.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)

    serve = sub.add_parser("serve", help="serve one or more models over HTTP")
    serve.add_argument(
        "models",
        nargs="*",
        metavar="MODEL",
        help="a package folder, a model store name, a built-in name (`vllm-srun models`) or a Hugging Face id "
        f"ORG/NAME[@REVISION] (the cache first, else a download) (default: {DEFAULT_MODEL})",
    )
    for field in SERVE_SETTINGS:
        if field is ENGINE_FIELD:  # the names come from the installed plugins, not the domain
            add_setting(serve, field, type=engine_name(engines), metavar="ENGINE", help=engine_help(engines))
        elif field.setting in (bounds.MODELS_FILE, bounds.TENANT_POLICIES):
            add_setting(serve, field, metavar="FILE")
        else:
            add_setting(serve, field)
    from vllm_srun.app import keys

    keys.add_security_flags(serve, worker=True)  # the process's door, not a serving setting (R-AUTH)
    keys.add_parser(sub)

    fixture = sub.add_parser("fixture", help="write a tiny random-weight model package (with its golden file)")
    fixture.add_argument("out", metavar="OUT", help="the folder to create (new or empty)")
    fixture.add_argument(
        "--family",
        required=True,
        help="encoder, decision, multimodal or audio; other families register their own writers (required, no default)",
    )
    fixture.add_argument(
        "--variant",
        default=None,
        help="encoder: embed, classify, multilabel, rerank, token, splade or colbert (BERT), or ARCH-KIND for ARCH "
        "among roberta, xlm-roberta, distilbert, mpnet, deberta-v2, modernbert (KIND embed, classify, rerank) and "
        "qwen3, qwen2, llama (embed, rerank); decision: llama, qwen3, qwen3_5 or qwen3_5_mm; multimodal: clip or "
        "siglip; audio: whisper or clap (default: the family's first)",
    )
    fixture.add_argument(
        "--seed", type=non_negative_int, default=0, help="seed of the random weights (default: %(default)s)"
    )
    fixture.add_argument("--no-golden", action="store_true", help="skip recording golden.json (default: record it)")

    pull = sub.add_parser("pull", help="place a built-in model in the local model store")
    pull.add_argument(
        "name", choices=sorted(CATALOG), metavar="NAME", help=f"a built-in model: {', '.join(sorted(CATALOG))}"
    )

    # ---- `quantize` (app/quantize.py, docs/quantization.md)
    quantize = sub.add_parser("quantize", help="write an int8 package of an encoder package (with its own golden file)")
    quantize.add_argument("model", metavar="MODEL", help="path, store name or built-in name of an FP32 encoder package")
    quantize.add_argument("out", metavar="OUT", help="the folder to create (new or empty)")
    quantize.add_argument(
        "--int8",
        action="store_true",
        help="int8 weights per output channel, activations quantized per token at run time (required, the only scheme)",
    )

    from vllm_srun.app import inventory_cli

    inventory_cli.add_parsers(sub)  # `models`, `plugins`, `devices`
    from vllm_srun.app import simulate_cli

    simulate_cli.add_parser(sub, positive_int, arg_type(bounds.BATCH_WINDOW_MS))
    from vllm_srun.app import batch_cli

    # `vllm-srun batch` (app/batch_cli.py, docs/batch.md)
    batch_cli.add_parser(sub, engine_name(engines), engine_help(engines))
    return parser


def default_threads() -> int:
    """`vllm-srun serve`'s forward threads when `--threads` is not given: the whole CPU budget."""
    from vllm_srun.adapters.workers.cpu_budget import front_cpu_budget
    from vllm_srun.domain.worker.threads import standalone_threads

    return standalone_threads(front_cpu_budget())


def serve_settings(ns: argparse.Namespace) -> WorkerSettings:
    """The settings record a parsed `vllm-srun serve` command line gives (canonical)."""
    values = {field.name: getattr(ns, field.name) for field in SERVE_SETTINGS}
    return msgspec.convert({"models": ns.models, **values}, WorkerSettings).normalized()


def cpu_settings(ns: WorkerSettings, env: Mapping[str, str]) -> tuple[CpuPlan, Mode]:
    """How the forwards use the CPUs, and the adaptive mode, or a one-line refusal (R-ARG-2,
    R-CPU): a thread count above the budget, an unknown adaptive mode, `--deterministic` with
    adaptive mode 2, `--concurrent-forwards` that does not divide the threads or comes with
    adaptive threads, a bad `VLLM_SRUN_FORWARD_NICE`, `VLLM_SRUN_EXPRESS_FORWARD` or
    `VLLM_SRUN_LANE_YIELD`. (An engine that cannot honour `--deterministic` says so itself: `serve`,
    `EngineRegistry.flag_refusal`.)
    With N concurrent forwards (`--concurrent-forwards`, else `default_concurrent_forwards`)
    each runs on threads ÷ N."""
    from vllm_srun.adapters.workers.cpu_budget import front_cpu_budget

    budget_cpus = front_cpu_budget()
    refusal = threads_refusal(ns.threads, budget_cpus)
    if refusal:
        refuse(refusal)
    try:
        adaptive = parse_mode(env.get(ADAPTIVE_ENV))
        nice = forward_nice(env)
        express_forward(env)  # read again where a model's forwards are set up
        lane_yield(env)
    except ValueError as exc:
        refuse(str(exc))
    if ns.deterministic and adaptive is Mode.SERVE:
        refuse(f"--deterministic answers at one thread count; {ADAPTIVE_ENV}=2 serves others (use 0 or 1)")
    threads = ns.threads or standalone_threads(budget_cpus)
    concurrent = ns.concurrent_forwards
    if concurrent is None:
        concurrent = default_concurrent_forwards(threads, adaptive is not Mode.OFF)
    refusal = concurrent_forwards_refusal(concurrent, threads, adaptive is not Mode.OFF)
    if refusal:
        refuse(refusal)
    team = threads // concurrent  # each concurrent forward's own OpenMP team
    return CpuPlan(team, concurrent, budget_threads(budget_cpus), omp_wait_policy(team, env), nice), adaptive


def model_specs(settings: WorkerSettings, device: str) -> list[ModelSpec]:
    """The models to serve: the models file's entries, else the MODEL arguments (else the
    built-in default), each with the flags' per-model settings where it sets none of its own;
    refuses one line per problem."""
    if settings.models_file is None:
        from vllm_srun.domain.errors import ModelNotFound

        try:  # a Hub id's revision twice, or `--revision` for what is no Hub id
            return settings.model_specs(settings.models or (DEFAULT_MODEL,))
        except ModelNotFound as exc:
            refuse(exc.message)
    from vllm_srun.adapters.config.models_file import load_models_file
    from vllm_srun.adapters.config.schema import ConfigError

    try:
        return load_models_file(
            settings.models_file,
            flags=settings,
            device=device,
            dtype_refusal=dtype_refusal,
            engines=installed_engines(),
        )
    except OSError as exc:
        refuse(f"--models {settings.models_file}: {exc.strerror or exc}")
    except ConfigError as exc:
        refuse_all(exc.problems)


def serve(ns: argparse.Namespace) -> int:
    settings = serve_settings(ns)
    problems = settings.problems()
    if problems:
        refuse("; ".join(problems))
    from vllm_srun.adapters.contracts import EngineSettings

    device = settings.device  # `auto` becomes a device when the worker opens it (check_worker)
    by_file = settings.models_file is not None  # a models file's entries' dtypes are checked one by one
    dtype = settings.engine_args().dtype
    asked = EngineSettings(dtype="auto" if by_file else dtype, deterministic=settings.deterministic)
    try:
        refusal = installed_engines().flag_refusal(settings.engine_name, asked)  # whatever the model
    except PluginConflict as exc:  # the plugin cannot be loaded
        refuse(str(exc))
    if refusal is None and device != "auto" and not by_file:
        refusal = dtype_refusal(dtype, device)
    if refusal:
        refuse(refusal)
    cpu, adaptive = cpu_settings(settings, os.environ)
    policy = cpu.wait_policy
    if policy is not None:  # before torch (and its OpenMP) loads: it reads the policy once
        os.environ[WAIT_POLICY_ENV] = policy
    if cpu.concurrent > 1:  # ... and the count a thread starts with, before its forward declares one
        os.environ[OMP_THREADS_ENV] = str(cpu.team)
    specs = model_specs(settings, device)
    from vllm_srun.adapters.http.listeners import open_listener
    from vllm_srun.app.bootstrap import bootstrap_worker
    from vllm_srun.app.keys import security
    from vllm_srun.app.server import check_worker, run_worker

    try:  # keys, token and TLS files, before any model loads
        door = security(ns, settings.host, settings.uds, os.environ)
    except ValueError as exc:
        refuse(str(exc))
    worker = bootstrap_worker(
        settings,
        specs=specs,
        cpu=cpu,
        adaptive_threads=adaptive,
        wait_policy=policy or os.environ.get(WAIT_POLICY_ENV) or None,
        progress=_progress,
        auth=door.auth,
        tenants=door.tenants,
    )
    try:
        for warning in check_worker(worker):
            print(f"{PROG}: warning: {warning}", file=sys.stderr, flush=True)
        listener = open_listener(settings.host, settings.port, settings.uds, door.tls)  # a stale --uds is replaced
    except ValueError as exc:
        refuse(str(exc))
    return run_worker(worker, listener, log_level=settings.log_level, tls=door.tls)


def _progress(msg: str) -> None:
    from vllm_srun.adapters.model_store import stderr_line

    stderr_line(msg)


def pull(ns: argparse.Namespace) -> int:
    from vllm_srun.app.bootstrap import bootstrap_worker
    from vllm_srun.domain.errors import DomainError

    try:
        folder = bootstrap_worker().store().pull(ns.name, _progress)
    except DomainError as exc:
        refuse(exc.message)
    print(folder)
    return 0


def fixture(ns: argparse.Namespace) -> int:
    from vllm_srun.app.bootstrap import bootstrap_worker
    from vllm_srun.app.fixtures import fixture_families, write_fixture

    families = bootstrap_worker().families()
    known = fixture_families(families)
    if ns.family not in known:
        refuse(f"--family {ns.family}: no fixture writer (known: {', '.join(known)})")
    variants = families.get(ns.family).fixture_variants
    if ns.variant is not None and ns.variant not in variants:
        refuse(f"--variant {ns.variant}: {ns.family} fixtures come in {', '.join(variants)}")
    try:
        out = write_fixture(
            ns.out, ns.family, ns.variant, ns.seed, golden=not ns.no_golden, progress=_progress, families=families
        )
    except ValueError as exc:
        refuse(str(exc))
    print(out)
    return 0


def quantize(ns: argparse.Namespace) -> int:
    if not ns.int8:
        refuse("quantize: name the scheme: --int8 (the only one)")
    from vllm_srun.app.quantize import quantize as write_quantized

    try:
        out = write_quantized(ns.model, ns.out, progress=_progress)
    except (OSError, ValueError, RuntimeError) as exc:
        refuse(f"quantize: {exc}")
    print(out)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    try:
        parser = build_parser()
    except PluginConflict as exc:  # two distributions claim one engine name
        refuse(str(exc))
    ns = parser.parse_args(argv)
    if ns.command == "serve":
        return serve(ns)
    if ns.command == "pull":
        return pull(ns)
    if ns.command == "fixture":
        return fixture(ns)
    if ns.command == "quantize":
        return quantize(ns)
    if ns.command in ("models", "plugins", "devices"):
        from vllm_srun.app import inventory_cli

        try:
            return inventory_cli.run(ns)
        except PluginConflict as exc:
            refuse(str(exc))
    if ns.command == "key":
        from vllm_srun.app import keys

        return keys.run(ns)
    if ns.command == "batch":
        from vllm_srun.app import batch_cli

        return batch_cli.run(ns, cpu_settings, model_specs)
    if ns.command == "simulate":
        from vllm_srun.app import simulate_cli

        try:
            return simulate_cli.run(ns)
        except (OSError, ValueError, KeyError) as exc:
            refuse(f"simulate: {exc}")
    raise AssertionError(ns.command)  # pragma: no cover


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
