"""A worker's settings survive their command line: for any valid `WorkerSettings`, the worker's
own parser reads `to_argv()` back into the same settings, so the front never re-parses argv
(R-REP-1, R-ARG)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_srun.adapters.config.declarations import declared
from vllm_srun.adapters.config.schema import DeploymentConfig
from vllm_srun.adapters.config.settings import WorkerSettings
from vllm_srun.adapters.engines.registry import installed_engines
from vllm_srun.adapters.workers.command import worker_settings
from vllm_srun.app.cli import build_parser, serve_settings
from vllm_srun.domain.settings import bounds

# anything a command line can carry: no NUL, no lone surrogates
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))
MODEL = TEXT.filter(lambda name: name != "" and not name.startswith("-"))
ENGINES = installed_engines().choices()  # auto and every installed engine plugin


def ints(setting: bounds.IntSetting[object]) -> st.SearchStrategy[int]:
    return st.integers(setting.low, setting.high if setting.high is not None else 2**40)


def maybe(strategy: st.SearchStrategy[object]) -> st.SearchStrategy[object]:
    return st.none() | strategy


def floats(setting: bounds.FloatSetting[object]) -> st.SearchStrategy[float]:
    return st.floats(setting.low, setting.high)


SETTINGS = st.builds(
    WorkerSettings,
    models=st.lists(MODEL, max_size=3).map(tuple),
    device=st.from_regex(bounds.DEVICE.pattern, fullmatch=True),
    engine=maybe(st.sampled_from(ENGINES)),
    host=TEXT,
    port=ints(bounds.PORT),
    uds=maybe(TEXT),
    max_num_seqs=maybe(ints(bounds.MAX_NUM_SEQS)),
    max_num_batched_tokens=maybe(ints(bounds.MAX_NUM_BATCHED_TOKENS)),
    batch_window_ms=maybe(floats(bounds.BATCH_WINDOW_MS)),
    dtype=maybe(st.sampled_from(bounds.DTYPE.choices)),
    enable_shared_context=maybe(st.booleans()),
    max_model_len=maybe(ints(bounds.MAX_MODEL_LEN)),
    result_cache_entries=maybe(ints(bounds.RESULT_CACHE_ENTRIES)),
    media_workers=maybe(ints(bounds.MEDIA_WORKERS)),
    max_request_bytes=ints(bounds.MAX_REQUEST_BYTES),
    threads=maybe(ints(bounds.THREADS)),
    concurrent_forwards=maybe(ints(bounds.CONCURRENT_FORWARDS)),
    log_level=st.sampled_from(bounds.LOG_LEVEL.choices),
    deterministic=st.booleans(),
    max_queue=maybe(ints(bounds.MAX_QUEUE)),
    max_queued_tokens=maybe(ints(bounds.MAX_QUEUED_TOKENS)),
    max_bundle_tasks=ints(bounds.MAX_BUNDLE_TASKS),
    models_file=maybe(TEXT),
    max_request_tokens=maybe(ints(bounds.MAX_REQUEST_TOKENS)),
    header_timeout=floats(bounds.HEADER_TIMEOUT),
    keep_alive_timeout=floats(bounds.KEEP_ALIVE_TIMEOUT),
    body_timeout=floats(bounds.BODY_TIMEOUT),
    max_header_bytes=ints(bounds.MAX_HEADER_BYTES),
    max_connections=ints(bounds.MAX_CONNECTIONS),
    family=maybe(st.from_regex(bounds.FAMILY.pattern, fullmatch=True)),
    memory_budget_gib=maybe(floats(bounds.MEMORY_BUDGET_GIB)),
    revision=maybe(st.from_regex(bounds.REVISION.pattern, fullmatch=True)),
    served_model_name=maybe(st.from_regex(bounds.SERVED_MODEL_NAME.pattern, fullmatch=True)),
    offline=st.booleans(),
    cache_dir=maybe(TEXT),
    load_attempts=ints(bounds.LOAD_ATTEMPTS),
    load_retry_seconds=floats(bounds.LOAD_RETRY_SECONDS),
).filter(
    lambda settings: (
        not (settings.models and settings.models_file is not None)
        # `--revision` and `--served-model-name` name one MODEL argument (`WorkerSettings.problems`)
        and (settings.revision is None or (len(settings.models) == 1 and settings.models_file is None))
        and (settings.served_model_name is None or (len(settings.models) <= 1 and settings.models_file is None))
    )
)


def or_default(value: int | None, setting: bounds.IntSetting[int]) -> int:
    return setting.default if value is None else value


def read_back(settings: WorkerSettings) -> WorkerSettings:
    return serve_settings(build_parser().parse_args(settings.to_argv()))


@settings(deadline=None)  # the first example builds the worker's parser (lazy imports)
@given(SETTINGS)
def test_the_worker_reads_any_valid_settings_back_from_their_argv(worker: WorkerSettings) -> None:
    assert worker.problems() == []
    canonical = worker.normalized()
    assert read_back(worker) == canonical  # a value equal to the default reads back unset
    assert read_back(canonical) == canonical
    assert canonical.engine_args() == worker.engine_args() and canonical.admission() == worker.admission()


def test_every_declared_field_is_a_worker_flag_and_the_strategy_covers_it() -> None:
    """The settings record is the one declaration: each of its fields is a flag of the worker, and
    the property above draws every one of them (a new field cannot be forgotten)."""
    flags = set(vars(build_parser().parse_args(["serve"])))
    names = {field.name for field in declared(WorkerSettings)}
    assert names <= flags
    assert names | {"models"} == set(WorkerSettings.__struct_fields__)


@given(
    seqs=maybe(ints(bounds.MAX_NUM_SEQS)),
    window=maybe(st.floats(bounds.BATCH_WINDOW_MS.low, bounds.BATCH_WINDOW_MS.high)),
    dtype=maybe(st.sampled_from(bounds.DTYPE.choices)),
    engine=maybe(st.sampled_from(ENGINES)),
    entries=maybe(ints(bounds.RESULT_CACHE_ENTRIES)),
    device=st.from_regex(bounds.REPLICA_DEVICE.pattern, fullmatch=True),
    threads=maybe(ints(bounds.THREADS)),
    queue=maybe(ints(bounds.MAX_QUEUE)),
    queued_tokens=maybe(ints(bounds.MAX_QUEUED_TOKENS)),
    request_tokens=maybe(ints(bounds.MAX_REQUEST_TOKENS)),
)
def test_what_the_front_builds_from_a_deployment_is_what_the_worker_reads(
    seqs: int | None,
    window: float | None,
    dtype: str | None,
    engine: str | None,
    entries: int | None,
    device: str,
    threads: int | None,
    queue: int | None,
    queued_tokens: int | None,
    request_tokens: int | None,
) -> None:
    deployment = DeploymentConfig(
        artifact="m",
        max_num_seqs=seqs,
        batch_window_ms=window,
        dtype=dtype,
        engine=engine,
        result_cache_entries=entries,
        max_queue=queue,
        max_queued_tokens=queued_tokens,
        max_request_tokens=request_tokens,
    )
    settings = worker_settings(deployment, device=device, uds="/s/w0.sock", threads=threads, max_request_bytes=1)
    assert settings.problems() == []
    worker = read_back(settings)
    assert worker == settings
    args = worker.engine_args()
    assert args.max_num_seqs == seqs
    assert args.dtype == (dtype or bounds.DTYPE.default)
    assert args.batch_window_ms == (bounds.BATCH_WINDOW_MS.default if window is None else window)
    assert worker.engine_name == (engine or bounds.ENGINE.default)
    assert or_default(worker.result_cache_entries, bounds.RESULT_CACHE_ENTRIES) == (
        bounds.RESULT_CACHE_ENTRIES.default if entries is None else entries
    )
    assert worker.threads == (threads if device in ("cpu", "auto") else None)
    assert worker.admission().max_queue == (bounds.MAX_QUEUE.default if queue is None else queue)
    assert worker.admission().max_queued_tokens == (
        bounds.MAX_QUEUED_TOKENS.default if queued_tokens is None else queued_tokens
    )
    assert or_default(worker.max_request_tokens, bounds.MAX_REQUEST_TOKENS) == (
        bounds.MAX_REQUEST_TOKENS.default if request_tokens is None else request_tokens
    )
