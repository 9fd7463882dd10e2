"""`vllm-srun batch INPUT OUTPUT`: its flags, and its two targets (docs/batch.md).

`--url URL`: a running worker or front, over HTTP. `--model NAME_OR_PATH` (and `serve`'s
serving flags): the worker's runtime built in this process (`bootstrap_worker`, with the same
refusals as `serve`) and its own ASGI app driven through httpx's ASGI transport, so the lines
go through the very handlers, admission, scheduler and error table a served request does.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import msgspec

from vllm_srun.adapters.config.declarations import Declared, by_setting, declared
from vllm_srun.adapters.config.settings import WorkerSettings
from vllm_srun.adapters.schemas.routes import SURFACE_SCHEMAS
from vllm_srun.app.flags import add_setting, positive_int
from vllm_srun.domain.inputs.batch_jobs import API_KEY_ENV, CONCURRENCY, MAX_RETRIES
from vllm_srun.domain.settings import bounds

if TYPE_CHECKING:
    from vllm_srun.app.batch import BatchOptions, Summary
    from vllm_srun.app.bootstrap import WorkerContainer
    from vllm_srun.domain.worker.adaptive_threads import Mode
    from vllm_srun.domain.worker.threads import CpuPlan
    from vllm_srun.domain.worker.worker_settings import ModelSpec

    # what `serve` lends (app/cli.py; this module does not import it: cli imports this one)
    CpuSettings = Callable[[WorkerSettings, Mapping[str, str]], tuple[CpuPlan, Mode]]
    ModelSpecs = Callable[[WorkerSettings, str], list[ModelSpec]]

# `serve` flags that are about listening, not serving: a batch run listens nowhere
LISTENING = (
    bounds.HOST,
    bounds.PORT,
    bounds.UDS,
    bounds.LOG_LEVEL,
    bounds.TENANT_POLICIES,
    bounds.HEADER_TIMEOUT,
    bounds.KEEP_ALIVE_TIMEOUT,
    bounds.BODY_TIMEOUT,
    bounds.MAX_HEADER_BYTES,
    bounds.MAX_CONNECTIONS,
)
URLS = frozenset(schema.path for schema in SURFACE_SCHEMAS)  # every POST route the worker serves
WAIT_S = 600.0  # --wait: how long a run waits for its server (or its models) to be ready


PROG = "vllm-srun"
# the serving flags a local batch run takes: `serve`'s, less the listening ones
BATCH_SETTINGS: tuple[Declared, ...] = tuple(f for f in declared(WorkerSettings) if f.setting not in LISTENING)
ENGINE_FIELD = by_setting(WorkerSettings, bounds.ENGINE)


def refuse(message: str) -> NoReturn:
    """One line on stderr, exit status 2 (as `cli.refuse`)."""
    print(f"{PROG}: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def add_parser(sub: Any, engine_type: Callable[[str], str], engine_help: str) -> None:
    """`batch`'s parser; ENGINE_TYPE and ENGINE_HELP: `serve`'s `--engine` (the installed plugins)."""
    batch = sub.add_parser(
        "batch",
        help="answer a JSONL file of OpenAI batch requests (embeddings, classify, rerank, decisions)",
        description="Answer INPUT's lines ({custom_id, method, url, body}) into OUTPUT, in input order; "
        "a rerun skips the custom_ids OUTPUT already holds.",
    )
    batch.add_argument("input", metavar="INPUT", help="the JSONL file of requests")
    batch.add_argument("output", metavar="OUTPUT", help="the JSONL file of answers (appended to: a rerun resumes)")
    target = batch.add_mutually_exclusive_group()
    target.add_argument(
        "--url",
        help=f"a running vllm-srun or vllm-sr server (key: ${API_KEY_ENV}) (default: none: --model runs it here)",
    )
    target.add_argument(
        "--model",
        action="append",
        dest="batch_models",
        metavar="NAME_OR_PATH",
        help="run this model here (path, store name or built-in name; repeat for several) (default: none: --url, "
        "or --models FILE)",
    )
    batch.add_argument(
        "--concurrency",
        type=positive_int,
        default=CONCURRENCY,
        help="requests in flight, answered or not yet written (default: %(default)s)",
    )
    batch.add_argument(
        "--wait",
        type=_seconds,
        default=WAIT_S,
        metavar="SECONDS",
        help="how long to wait for the server (--url) or the models (--model) to be ready (default: %(default)g)",
    )
    batch.add_argument(
        "--max-retries",
        type=positive_int,
        default=MAX_RETRIES,
        help="tries again of a line answered 429/503 or not reached, before the run stops (default: %(default)s)",
    )
    for field in BATCH_SETTINGS:
        if field is ENGINE_FIELD:
            add_setting(batch, field, type=engine_type, metavar="ENGINE", help=engine_help)
        elif field.setting is bounds.MODELS_FILE:
            add_setting(batch, field, metavar="FILE")
        else:
            add_setting(batch, field)


def run(ns: argparse.Namespace, cpu_settings: CpuSettings, model_specs: ModelSpecs) -> int:
    """Run `batch`; CPU_SETTINGS and MODEL_SPECS: `serve`'s (refusing one line each)."""
    from vllm_srun.app.batch import BatchOptions, BatchRefused

    source, output = Path(ns.input), Path(ns.output)
    if not source.is_file():
        refuse(f"batch: {source}: no such file")
    if output.exists() and output.resolve() == source.resolve():
        refuse("batch: OUTPUT is INPUT; name another file")
    if ns.url is None and not ns.batch_models and ns.models_file is None:
        refuse("batch: name the model (--model NAME_OR_PATH, or --models FILE) or a server (--url URL)")
    if ns.url is not None and ns.models_file is not None:
        refuse("batch: --models FILE runs models here; --url sends to a server: name one")
    if output.exists() and not output.is_file():
        refuse(f"batch: {output}: OUTPUT is not a file")
    options = BatchOptions(concurrency=ns.concurrency, max_retries=ns.max_retries, ready_timeout_s=ns.wait)
    try:
        if ns.url is not None:
            summary = asyncio.run(_remote(ns.url, source, output, options))
        else:
            summary = _local(ns, source, output, options, _worker(_settings(ns), cpu_settings, model_specs))
    except BatchRefused as exc:
        refuse(f"batch: {exc}")
    except BaseExceptionGroup as group:  # the app's lifespan runs the batch inside a task group
        refused = group.subgroup(BatchRefused)
        if refused is None:
            raise
        refuse(f"batch: {_first(refused)}")
    return 0 if summary.stopped is None else 1


def _first(group: BaseExceptionGroup) -> BaseException:
    """The first leaf exception of GROUP."""
    first = group.exceptions[0]
    return _first(first) if isinstance(first, BaseExceptionGroup) else first


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a number of seconds above 0")
    return value


async def _remote(url: str, source: Path, output: Path, options: BatchOptions) -> Summary:
    import httpx

    from vllm_srun.app.batch import run_batch, wait_ready
    from vllm_srun.app.batch_progress import ProgressBar

    key = os.environ.get(API_KEY_ENV)
    headers = {"authorization": f"Bearer {key}"} if key else {}
    limits = httpx.Limits(max_connections=options.concurrency, max_keepalive_connections=options.concurrency)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=None, limits=limits) as client:
        bar = ProgressBar()
        await wait_ready(client, options.ready_timeout_s, bar.say)
        return await run_batch(client, source, output, URLS, options, bar)


def _settings(ns: argparse.Namespace) -> WorkerSettings:
    values = {f.name: getattr(ns, f.name) for f in BATCH_SETTINGS}
    return msgspec.convert({"models": ns.batch_models or (), **values}, WorkerSettings).normalized()


def _local(
    ns: argparse.Namespace, source: Path, output: Path, options: BatchOptions, worker: WorkerContainer
) -> Summary:
    import httpx

    from vllm_srun.app.batch import run_batch, wait_ready
    from vllm_srun.app.batch_progress import ProgressBar

    app = worker.app()

    async def drive() -> Summary:
        async with app.lifespan():  # starts loading the models, as `serve` does; stops the runtime after
            transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]  # litestar types its scopes as TypedDicts
            async with httpx.AsyncClient(transport=transport, base_url="http://batch", timeout=None) as client:
                bar = ProgressBar()
                await wait_ready(client, options.ready_timeout_s, bar.say)
                return await run_batch(client, source, output, URLS, options, bar)

    return asyncio.run(drive())


def _worker(settings: WorkerSettings, cpu_settings: CpuSettings, model_specs: ModelSpecs) -> WorkerContainer:
    """`serve`'s checks and composition, without a listener (R-ARG-2: refusals before loading)."""
    from vllm_srun.adapters.contracts import EngineSettings
    from vllm_srun.adapters.engines.registry import installed_engines
    from vllm_srun.adapters.plugins import PluginConflict
    from vllm_srun.app.bootstrap import bootstrap_worker
    from vllm_srun.app.server import check_worker
    from vllm_srun.domain.settings.dtypes import dtype_refusal
    from vllm_srun.domain.worker.threads import OMP_THREADS_ENV, WAIT_POLICY_ENV

    problems = settings.problems()
    if problems:
        refuse("; ".join(problems))
    by_file = settings.models_file is not None
    dtype = settings.engine_args().dtype
    asked = EngineSettings(dtype="auto" if by_file else dtype, deterministic=settings.deterministic)
    try:
        refusal = installed_engines().flag_refusal(settings.engine_name, asked)
    except PluginConflict as exc:
        refuse(str(exc))
    if refusal is None and settings.device != "auto" and not by_file:
        refusal = dtype_refusal(dtype, settings.device)
    if refusal:
        refuse(refusal)
    cpu, adaptive = cpu_settings(settings, os.environ)
    if cpu.wait_policy is not None:
        os.environ[WAIT_POLICY_ENV] = cpu.wait_policy
    if cpu.concurrent > 1:
        os.environ[OMP_THREADS_ENV] = str(cpu.team)
    worker = bootstrap_worker(
        settings,
        specs=model_specs(settings, settings.device),
        cpu=cpu,
        adaptive_threads=adaptive,
        wait_policy=cpu.wait_policy or os.environ.get(WAIT_POLICY_ENV) or None,
        progress=_progress,
    )
    try:
        for warning in check_worker(worker):
            print(f"{PROG}: warning: {warning}", file=sys.stderr, flush=True)
    except ValueError as exc:
        refuse(str(exc))
    return worker


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
