"""`vllm-srun`: serve models, pull catalog models, write fixtures.

Every refusal is one line on stderr and a non-zero exit, before any model loads (R-ARG-2).
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import NoReturn, Sequence

from vllm_srun.adapters.catalog import CATALOG, DEFAULT_MODEL
from vllm_srun.app.flags import OneLineParser, add_setting, arg_type, non_negative_int, positive_int
from vllm_srun.domain import bounds
from vllm_srun.domain.dtypes import dtype_refusal, needs_bf16_warning
from vllm_srun.domain.engine_args import EngineArgs
from vllm_srun.domain.worker_settings import WorkerSettings

PROG = "vllm-srun"
# `serve` flags, in `--help` order; each is a setting of `domain/bounds.py`
SERVE_SETTINGS = (
    bounds.DEVICE, bounds.ENGINE, bounds.HOST, bounds.PORT, bounds.UDS, bounds.MAX_NUM_SEQS,
    bounds.MAX_NUM_BATCHED_TOKENS, bounds.BATCH_WINDOW_MS, bounds.DTYPE, bounds.ENABLE_SHARED_CONTEXT,
    bounds.MAX_MODEL_LEN, bounds.MAX_REQUEST_BYTES, bounds.THREADS, bounds.LOG_LEVEL,
    bounds.RESULT_CACHE_ENTRIES,
)


def refuse(message: str) -> NoReturn:
    print(f"{PROG}: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog=PROG, description="Serve non-generative models with cross-request batching.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)

    serve = sub.add_parser("serve", help="serve one or more models over HTTP")
    serve.add_argument("models", nargs="*", metavar="MODEL", help=f"path, store name or built-in name (default: {DEFAULT_MODEL})")
    for setting in SERVE_SETTINGS:
        add_setting(serve, setting)

    fixture = sub.add_parser("fixture", help="write a tiny random-weight model package (with its golden file)")
    fixture.add_argument("out", metavar="OUT", help="the folder to create (new or empty)")
    fixture.add_argument("--family", required=True, help="encoder or decision (other families register their own writers)")
    fixture.add_argument("--variant", default=None, help="encoder: embed, classify, multilabel or rerank; decision: llama or qwen3")
    fixture.add_argument("--seed", type=non_negative_int, default=0)
    fixture.add_argument("--no-golden", action="store_true", help="skip recording golden.json")

    pull = sub.add_parser("pull", help="place a built-in model in the local model store")
    pull.add_argument("name", choices=sorted(CATALOG), metavar="NAME")

    from vllm_srun.app import simulate_cli

    simulate_cli.add_parser(sub, positive_int, arg_type(bounds.BATCH_WINDOW_MS))
    return parser


def default_threads() -> int:
    from vllm_srun.adapters.workers.cpu_budget import front_cpu_budget
    from vllm_srun.domain.threads import standalone_threads

    return standalone_threads(front_cpu_budget())


def serve_settings(ns: argparse.Namespace) -> WorkerSettings:
    """The settings a parsed `vllm-srun serve` command line gives."""
    return WorkerSettings(
        models=tuple(ns.models),
        device=ns.device,
        engine=ns.engine,
        host=ns.host,
        port=ns.port,
        uds=ns.uds,
        engine_args=EngineArgs(
            max_num_seqs=ns.max_num_seqs,
            max_num_batched_tokens=ns.max_num_batched_tokens,
            batch_window_ms=ns.batch_window_ms,
            dtype=ns.dtype,
            enable_shared_context=ns.enable_shared_context,
            max_model_len=ns.max_model_len,
        ),
        result_cache_entries=ns.result_cache_entries,
        max_request_bytes=ns.max_request_bytes,
        threads=ns.threads,
        log_level=ns.log_level,
    )


def serve(ns: argparse.Namespace) -> int:
    settings = serve_settings(ns)
    problems = settings.problems()
    if problems:
        refuse("; ".join(problems))
    if ns.device != "cpu" and ns.device != "auto":
        import torch

        kind = ns.device.split(":")[0]
        if kind in ("cuda", "rocm") and not torch.cuda.is_available():
            refuse(f"--device {ns.device}: no GPU is visible to this process")
        if kind == "mps" and not torch.backends.mps.is_available():
            refuse("--device mps: MPS is not available on this machine")
    device = "cpu" if ns.device == "auto" else ns.device
    refusal = dtype_refusal(ns.dtype, device, ns.engine)
    if refusal:
        refuse(refusal)
    if ns.dtype == "bfloat16" and device == "cpu":
        from vllm_srun.adapters.devices.cpu_features import cpu_has_native_bf16

        if needs_bf16_warning(ns.dtype, device, cpu_has_native_bf16()):
            print(f"{PROG}: warning: --dtype bfloat16 on a CPU without native BF16 (no avx512_bf16/amx_bf16): "
                  "allowed, but emulated and slow", file=sys.stderr, flush=True)
    args = settings.engine_args
    models = ns.models or [DEFAULT_MODEL]
    from vllm_srun.app.preflight import engine_arg_refusal

    refusal = engine_arg_refusal(models, args, progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    if refusal:
        refuse(refusal)
    logging.basicConfig(level=ns.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    def progress(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    from vllm_srun.app.container import WorkerContainer
    from vllm_srun.app.server import run_server

    container = WorkerContainer()
    container.config.from_dict(
        {
            "models": [(m, args) for m in models],
            "device": device,
            "engine": ns.engine,
            "threads": ns.threads or default_threads(),
            "progress": progress,
            "max_request_bytes": ns.max_request_bytes,
            "result_cache_entries": ns.result_cache_entries,
        }
    )
    runtime = container.runtime()
    app = container.app()
    where = f"unix:{ns.uds}" if ns.uds else f"http://{ns.host}:{ns.port}"
    progress(f"serve: {', '.join(runtime.models)} on {where} (device {device})")
    run_server(app, host=ns.host, port=ns.port, uds=ns.uds, log_level=ns.log_level)
    return 0


def pull(ns: argparse.Namespace) -> int:
    from vllm_srun.adapters.model_store import pull as pull_model
    from vllm_srun.domain.errors import DomainError

    try:
        folder = pull_model(ns.name)
    except DomainError as exc:
        refuse(exc.message)
    print(folder)
    return 0


def fixture(ns: argparse.Namespace) -> int:
    from vllm_srun.adapters.families.fixtures import FIXTURE_WRITERS

    writer = FIXTURE_WRITERS.get(ns.family)
    if writer is None:
        refuse(f"--family {ns.family}: no fixture writer (known: {', '.join(sorted(FIXTURE_WRITERS))})")
    if ns.variant is not None and ns.variant not in writer.variants:
        refuse(f"--variant {ns.variant}: {ns.family} fixtures come in {', '.join(writer.variants)}")
    from vllm_srun.adapters.families.fixtures import write_fixture

    try:
        out = write_fixture(ns.out, ns.family, ns.variant, ns.seed, golden=not ns.no_golden,
                            progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    except ValueError as exc:
        refuse(str(exc))
    print(out)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    if ns.command == "serve":
        return serve(ns)
    if ns.command == "pull":
        return pull(ns)
    if ns.command == "fixture":
        return fixture(ns)
    if ns.command == "simulate":
        from vllm_srun.app import simulate_cli

        try:
            return simulate_cli.run(ns)
        except (OSError, ValueError, KeyError) as exc:
            refuse(f"simulate: {exc}")
    raise AssertionError(ns.command)  # pragma: no cover


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
