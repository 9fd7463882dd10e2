"""`vllm-srun`: serve models, pull catalog models, write fixtures.

Every refusal is one line on stderr and a non-zero exit, before any model loads (R-ARG-2).
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn, Sequence

from vllm_srun.adapters.catalog import CATALOG, DEFAULT_MODEL
from vllm_srun.adapters.serving.result_cache import DEFAULT_RESULT_CACHE_ENTRIES
from vllm_srun.domain.dtypes import dtype_refusal
from vllm_srun.domain.engine_args import DTYPES, EngineArgs

PROG = "vllm-srun"


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def refuse(message: str) -> NoReturn:
    print(f"{PROG}: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def _window_ms(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected milliseconds, got {text!r}") from None
    if not (0 <= value <= 10_000):
        raise argparse.ArgumentTypeError(f"must be between 0 and 10000 ms, got {value:g}")
    return value


def _port(text: str) -> int:
    value = _non_negative_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"not a TCP port: {value}")
    return value


def _device(text: str) -> str:
    import re

    if not re.fullmatch(r"cpu|auto|mps|(cuda|rocm)(:\d+)?", text):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda:N, rocm:N, mps or auto, got {text!r}")
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog=PROG, description="Serve non-generative models with cross-request batching.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)

    serve = sub.add_parser("serve", help="serve one or more models over HTTP")
    serve.add_argument("models", nargs="*", metavar="MODEL", help=f"path, store name or built-in name (default: {DEFAULT_MODEL})")
    serve.add_argument("--device", type=_device, default="cpu")
    serve.add_argument("--engine", choices=["auto", "native", "onnxruntime"], default="auto")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=_port, default=8100)
    serve.add_argument("--uds", default=None, help="serve on this Unix socket instead of TCP")
    serve.add_argument("--max-num-seqs", type=_positive_int, default=None)
    serve.add_argument("--max-num-batched-tokens", type=_positive_int, default=None)
    serve.add_argument("--batch-window-ms", type=_window_ms, default=2.0)
    serve.add_argument("--dtype", choices=DTYPES, default="auto")
    serve.add_argument(
        "--enable-shared-context", action=argparse.BooleanOptionalAction, default=None,
        help="decision models: run a multi-question request's state once (default: on for decision models)",
    )
    serve.add_argument("--max-model-len", type=_positive_int, default=None,
                       help="decision models: most input tokens one question's prompt may have (default: the package's limit)")
    serve.add_argument("--max-request-bytes", type=_positive_int, default=8 * 1024 * 1024)
    serve.add_argument("--threads", type=_positive_int, default=None, help="CPU threads for forwards (default: the CPU budget less one, at least 1)")
    serve.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default="info")
    serve.add_argument(
        "--result-cache-entries", type=_non_negative_int, default=DEFAULT_RESULT_CACHE_ENTRIES,
        help=f"answers kept in this worker's LRU result cache (default {DEFAULT_RESULT_CACHE_ENTRIES}, "
        "at most 64 MiB of answers; 0 turns it off)",
    )

    fixture = sub.add_parser("fixture", help="write a tiny random-weight model package (with its golden file)")
    fixture.add_argument("out", metavar="OUT", help="the folder to create (new or empty)")
    fixture.add_argument("--family", required=True, help="encoder or decision (other families register their own writers)")
    fixture.add_argument("--variant", default=None, help="encoder: embed, classify, multilabel or rerank; decision: llama or qwen3")
    fixture.add_argument("--seed", type=_non_negative_int, default=0)
    fixture.add_argument("--no-golden", action="store_true", help="skip recording golden.json")

    pull = sub.add_parser("pull", help="place a built-in model in the local model store")
    pull.add_argument("name", choices=sorted(CATALOG), metavar="NAME")

    from vllm_srun.app import simulate_cli

    simulate_cli.add_parser(sub, _positive_int, _window_ms)
    return parser


def default_threads() -> int:
    from vllm_srun.adapters.workers.cpu_budget import front_cpu_budget
    from vllm_srun.domain.threads import standalone_threads

    return standalone_threads(front_cpu_budget())


def serve(ns: argparse.Namespace) -> int:
    if ns.max_num_batched_tokens is not None and ns.max_num_batched_tokens < 8:
        refuse(f"--max-num-batched-tokens must be >= 8, got {ns.max_num_batched_tokens}")
    device = "cpu" if ns.device == "auto" else ns.device
    refusal = dtype_refusal(ns.dtype, device, ns.engine)
    if refusal:
        refuse(refusal)
    args = EngineArgs(
        max_num_seqs=ns.max_num_seqs,
        max_num_batched_tokens=ns.max_num_batched_tokens,
        batch_window_ms=ns.batch_window_ms,
        dtype=ns.dtype,
        enable_shared_context=ns.enable_shared_context,
        max_model_len=ns.max_model_len,
    )
    problems = args.problems()
    if problems:
        refuse(problems[0])
    from vllm_srun.app.container import worker_container
    from vllm_srun.app.server import check_worker, run_worker

    container = worker_container(
        [(m, args) for m in ns.models or [DEFAULT_MODEL]], device=device, engine=ns.engine,
        threads=ns.threads or default_threads(), progress=_progress, max_request_bytes=ns.max_request_bytes,
        result_cache_entries=ns.result_cache_entries,
    )
    try:
        for warning in check_worker(container, args):
            print(f"{PROG}: warning: {warning}", file=sys.stderr, flush=True)
    except ValueError as exc:
        refuse(str(exc))
    run_worker(container, host=ns.host, port=ns.port, uds=ns.uds, log_level=ns.log_level)
    return 0


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def pull(ns: argparse.Namespace) -> int:
    from vllm_srun.app.container import WorkerContainer
    from vllm_srun.domain.errors import DomainError

    try:
        folder = WorkerContainer().store().pull(ns.name, _progress)
    except DomainError as exc:
        refuse(exc.message)
    print(folder)
    return 0


def fixture(ns: argparse.Namespace) -> int:
    from vllm_srun.app.container import WorkerContainer
    from vllm_srun.app.fixtures import fixture_families, write_fixture

    families = WorkerContainer().families()
    known = fixture_families(families)
    if ns.family not in known:
        refuse(f"--family {ns.family}: no fixture writer (known: {', '.join(known)})")
    variants = families.get(ns.family).fixture_variants
    if ns.variant is not None and ns.variant not in variants:
        refuse(f"--variant {ns.variant}: {ns.family} fixtures come in {', '.join(variants)}")
    try:
        out = write_fixture(ns.out, ns.family, ns.variant, ns.seed, golden=not ns.no_golden, progress=_progress,
                            families=families)
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
