"""The serving settings, declared once (R-ARG, R-ARG-2, R-REP-1): one frozen msgspec record.

Each setting is one field of the Structs below: its name, its type, its range and default (from
`domain/bounds.py`, through `declare`) and its help text. Everything else is derived from them:
- `vllm-srun serve`'s and `vllm-sr serve`'s flags (`app/flags.py` walks `declared(...)`);
- a models file entry (`models_file.ModelEntry` is a `ModelArgs`) and a deployment
  (`schema.DeploymentConfig` is a `ServingArgs`), checked by msgspec from the same types;
- the worker's command line (`WorkerSettings.to_argv()`, read back by `vllm-srun serve` into an
  equal record) and `WorkerSettings.problems()`;
- the domain's value types (`EngineArgs`, `AdmissionLimits`, `ConnectionLimits`, `ModelSpec`),
  converted here and nowhere else.

In `ModelArgs` and `ServingArgs` None means "not set": the worker's flag for a models file entry,
the worker's default for a deployment or a flag. A record is kept canonical (`normalized`): a
value equal to the domain's default is stored as None, so two records that mean the same worker
are equal and render the same command line.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

import msgspec
from msgspec import Meta, Struct
from msgspec.inspect import Metadata, UnionType, type_info

from vllm_srun.adapters.hub import parse_hub_id
from vllm_srun.domain import bounds
from vllm_srun.domain.admission import AdmissionLimits
from vllm_srun.domain.connections import ConnectionLimits
from vllm_srun.domain.engine_args import EngineArgs
from vllm_srun.domain.errors import ModelNotFound
from vllm_srun.domain.profiles import settings_refusal
from vllm_srun.domain.worker_settings import ModelSpec

S = TypeVar("S", bound="Settings")

# msgspec reads a Literal's values at run time: the bounds module's choices, stated once there.
# A type checker cannot read them, so it sees the fields as strings.
if TYPE_CHECKING:
    Dtype = str
    LogLevel = str
    Overflow = str
    ProfileChoice = str
else:
    Dtype = Literal[bounds.DTYPE.choices]
    LogLevel = Literal[bounds.LOG_LEVEL.choices]
    Overflow = Literal[bounds.INPUT_OVERFLOW.choices]
    ProfileChoice = Literal[bounds.PROFILE.choices]


def declare(setting: bounds.Setting[Any], help: str, *, shown: str = "") -> Meta:
    """A field's declaration: SETTING's range (msgspec checks it when a file or config is read),
    what the setting does (HELP) and, where its default value does not say it, the default in
    words (SHOWN, e.g. `by device class`)."""
    limits: dict[str, Any] = {}
    if isinstance(setting, (bounds.IntSetting, bounds.FloatSetting)):
        limits = {"ge": setting.low, "le": setting.high}
    elif isinstance(setting, bounds.PatternSetting):
        limits = {"pattern": f"^({setting.pattern})$"}
    return Meta(description=help, extra={"setting": setting, "shown": shown}, **limits)


@dataclass(frozen=True, slots=True)
class Declared:
    """One declared field as the CLIs need it: its config name (the argparse dest), its setting
    (flag, parsing, range), its help text and the record's default."""

    name: str
    setting: bounds.Setting[Any]
    help: str
    shown: str
    default: Any

    @property
    def flag(self) -> str:
        return self.setting.flag

    def default_text(self) -> str:
        """The default as `--help` shows it."""
        return self.shown or bounds.spell(self.setting.default)

    def help_text(self) -> str:
        """What the setting does and its default, for argparse."""
        return f"{self.help} (default: {self.default_text()})"


@cache
def declared(record: type[Struct]) -> tuple[Declared, ...]:
    """The declared fields of RECORD, in order (fields without a declaration, e.g. `models`, are
    left out)."""
    found = []
    for field in type_info(record).fields:  # type: ignore[attr-defined]
        node = field.type
        if isinstance(node, UnionType):
            node = next((member for member in node.types if isinstance(member, Metadata)), node)
        if isinstance(node, Metadata) and node.extra and "setting" in node.extra:
            help_text = (node.extra_json_schema or {}).get("description", "")
            found.append(Declared(field.name, node.extra["setting"], help_text, node.extra["shown"], field.default))
    return tuple(found)


def by_setting(record: type[Struct], setting: bounds.Setting[Any]) -> Declared:
    return next(d for d in declared(record) if d.setting is setting)


class Settings(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of the settings records: frozen, keyword construction, unknown fields refused."""

    def problems(self) -> list[str]:
        """One line per value its setting refuses (R-ARG-2); [] when they may run."""
        return bounds.problems((d.setting, getattr(self, d.name)) for d in declared(type(self)))

    def normalized(self: S) -> S:
        """The same settings, canonical: an unset-able value equal to the domain's default is None."""
        changes = {
            d.name: None
            for d in declared(type(self))
            if d.default is None and d.setting.default is not None and _same(getattr(self, d.name), d.setting.default)
        }
        return msgspec.structs.replace(self, **changes) if changes else self


class ModelArgs(Settings, frozen=True, kw_only=True):
    """What each model may set for itself: in a models file entry, a deployment and (as every
    entry's default) the worker's flags. None: not set."""

    engine: Annotated[str, declare(bounds.ENGINE, "the runtime engine")] | None = None
    family: (
        Annotated[
            str,
            declare(
                bounds.FAMILY,
                "the family that reads the package, instead of the detected one; refused when it cannot read it",
                shown="detected from the package",
            ),
        ]
        | None
    ) = None
    max_num_seqs: (
        Annotated[
            int,
            declare(bounds.MAX_NUM_SEQS, "most rows in one forward; 1 runs every row alone", shown="by device class"),
        ]
        | None
    ) = None
    max_num_batched_tokens: (
        Annotated[
            int, declare(bounds.MAX_NUM_BATCHED_TOKENS, "most counted tokens in one forward", shown="by device class")
        ]
        | None
    ) = None
    batch_window_ms: (
        Annotated[float, declare(bounds.BATCH_WINDOW_MS, "milliseconds the first queued row waits for company")] | None
    ) = None
    dtype: (
        Annotated[
            Dtype,
            declare(
                bounds.DTYPE,
                "the precision the model computes in; auto: the package's, FP32 for a BF16 model on a CPU",
            ),
        ]
        | None
    ) = None
    profile: (
        Annotated[
            ProfileChoice,
            declare(
                bounds.PROFILE,
                "what the model may trade for speed: exact (every answer its row's alone, published "
                "precision), shared_context, batching or max_speed; requests may still ask for exact",
                shown="exact, unless enable_shared_context or a dtype other than the published asks for more",
            ),
        ]
        | None
    ) = None
    memory_budget_gib: (
        Annotated[
            float,
            declare(
                bounds.MEMORY_BUDGET_GIB,
                "GiB a model's weights may hold at the precision it computes in; a larger one is refused "
                "before its weights are read, naming both figures",
                shown="none",
            ),
        ]
        | None
    ) = None
    enable_shared_context: (
        Annotated[
            bool,
            declare(
                bounds.ENABLE_SHARED_CONTEXT,
                "decision models: run a multi-question request's state once (a spelling of profile shared_context)",
                shown="off: on under profiles shared_context and max_speed",
            ),
        ]
        | None
    ) = None
    max_model_len: (
        Annotated[
            int,
            declare(
                bounds.MAX_MODEL_LEN,
                "decision models: most input tokens one question's prompt may have",
                shown="the package's limit",
            ),
        ]
        | None
    ) = None
    # the input budget, written `input: {max_tokens, overflow}` in a config or models file
    input_max_tokens: (
        Annotated[
            int,
            declare(
                bounds.INPUT_MAX_TOKENS,
                "most tokens one input may have (classify, embeddings, rerank, decisions)",
                shown="the model's own limit",
            ),
        ]
        | None
    ) = None
    input_overflow: (
        Annotated[
            Overflow,
            declare(
                bounds.INPUT_OVERFLOW,
                "what is done with a longer input when the request does not say (embeddings: window is reject)",
            ),
        ]
        | None
    ) = None
    max_queue: (
        Annotated[
            int,
            declare(
                bounds.MAX_QUEUE, "unanswered requests one model may hold; past it: 429 overloaded with Retry-After"
            ),
        ]
        | None
    ) = None
    max_queued_tokens: (
        Annotated[
            int,
            declare(
                bounds.MAX_QUEUED_TOKENS,
                "tokens of the unanswered requests one model may hold, counted as request-body bytes "
                "(an upper bound); applies only while a request is pending",
            ),
        ]
        | None
    ) = None

    def problems(self) -> list[str]:
        """One line per refused value, and a profile its other settings contradict (R-PROF-3)."""
        refusal = settings_refusal(self.profile, self.enable_shared_context)
        return super().problems() + ([refusal] if refusal else [])

    def engine_args(self) -> EngineArgs:
        """The domain's engine arguments: the set values, the domain's defaults for the rest."""
        default = _ENGINE_ARGS
        return EngineArgs(
            max_num_seqs=_or(self.max_num_seqs, default.max_num_seqs),
            max_num_batched_tokens=_or(self.max_num_batched_tokens, default.max_num_batched_tokens),
            batch_window_ms=_or(self.batch_window_ms, default.batch_window_ms),
            dtype=_or(self.dtype, default.dtype),
            enable_shared_context=_or(self.enable_shared_context, default.enable_shared_context),
            max_model_len=_or(self.max_model_len, default.max_model_len),
            input_max_tokens=_or(self.input_max_tokens, default.input_max_tokens),
            input_overflow=_or(self.input_overflow, default.input_overflow),
            profile=_or(self.profile, default.profile),
        )

    def admission(self) -> AdmissionLimits:
        """The domain's admission limits (R-ADM-1)."""
        return AdmissionLimits(
            _or(self.max_queue, bounds.MAX_QUEUE.default), _or(self.max_queued_tokens, bounds.MAX_QUEUED_TOKENS.default)
        )

    def over(self: S, base: ModelArgs) -> S:
        """These settings, each one left unset taken from BASE (a models file entry over the flags)."""
        inherited = {name: getattr(base, name) for name in ModelArgs.__struct_fields__ if getattr(self, name) is None}
        return msgspec.structs.replace(self, **inherited)

    def model_args(self) -> ModelArgs:
        """Just the per-model settings of a larger record."""
        return ModelArgs(**{name: getattr(self, name) for name in ModelArgs.__struct_fields__})


_MIB = bounds.MIB
_RESULT_CACHE_HELP = (
    f"answers kept in the LRU result cache, at most {bounds.RESULT_CACHE_BYTES // _MIB} MiB of them; 0 turns it off"
)


class ServingArgs(ModelArgs, frozen=True, kw_only=True):
    """What a deployment sets for its workers besides the per-model settings (and what the worker
    takes as flags)."""

    result_cache_entries: Annotated[int, declare(bounds.RESULT_CACHE_ENTRIES, _RESULT_CACHE_HELP)] | None = None
    media_workers: (
        Annotated[
            int,
            declare(
                bounds.MEDIA_WORKERS,
                "processes that decode and resize images and videos (R-MEDIA); 0 decodes in the request path",
                shown="one per 16 CPUs of the budget, 1 to 4",
            ),
        ]
        | None
    ) = None
    max_request_tokens: (
        Annotated[
            int,
            declare(
                bounds.MAX_REQUEST_TOKENS,
                "most tokens the rows of one request may hold (inputs, windows or questions together); 413 past it",
                shown="524288 (2,048 inputs of 256 tokens)",
            ),
        ]
        | None
    ) = None

    def serving_args(self) -> ServingArgs:
        """Just the serving settings of a larger record (a deployment's, for its workers)."""
        return ServingArgs(**{name: getattr(self, name) for name in ServingArgs.__struct_fields__})


_HEAD_HELP = "seconds a request head may take to arrive, from the connection's opening or the request's first byte"
_BODY_HELP = (
    "seconds a request body may take to arrive (408 past it), and a response may wait for the client to read it"
)
_CONCURRENT_HELP = (
    "forwards a CPU worker runs side by side, each on its own team of threads ÷ N "
    "(N divides the thread count; 1 with adaptive threads; a GPU runs one at a time)"
)
_DETERMINISTIC_HELP = (
    "answer every input bit-identically whatever its batch, the load, the cache or the thread count; "
    "refused where the engine cannot honour it"
)
_TENANT_POLICIES_HELP = (
    "a key file (`vllm-srun key add`) whose weight, max_queued_tokens and rate columns are the tenants' "
    "policies (R-FAIR); its keys are not asked for: the front that names the tenants checked them. "
    "How a front passes its key file's policies to its managed workers"
)
_REVISION_HELP = (
    "the branch, tag or commit of a Hugging Face id MODEL (ORG/NAME), as ORG/NAME@REV says it; one MODEL only"
)
# naming, families and budgets (R-PKG-6); Hub ids (R-PKG-5); load retries (R-LOAD-1)
_SERVED_NAME_HELP = "the name requests give in `model` and answers carry; one MODEL only"
_OFFLINE_HELP = "never ask the Hugging Face Hub: a Hub id MODEL resolves from the cache alone (as HF_HUB_OFFLINE=1)"
_CACHE_DIR_HELP = "the Hugging Face cache that Hub id MODELs resolve in and download into"
_LOAD_ATTEMPTS_HELP = (
    "loads of a model before a transient failure (a file still being written, a device busy or out of "
    "memory) is final; package, golden and capability failures are never tried again"
)
_LOAD_RETRY_HELP = (
    f"seconds before a model that failed transiently is loaded again, doubling after each failure, "
    f"at most {bounds.LOAD_RETRY_CAP_S:g}"
)
_MODELS_FILE_HELP = (
    "a YAML file of the models to serve, each with its own served name, device, engine and engine "
    "arguments (refused together with MODEL arguments)"
)


class WorkerSettings(ServingArgs, frozen=True, kw_only=True):
    """What one `vllm-srun serve` process is told (R-ARG, R-REP-1, R-CPU-1): the models, where it
    listens, its device, the per-model settings every model takes unless its models file entry
    sets its own, and its limits. The worker CLI parses its argv into one; the front builds one
    per managed worker and renders it with `to_argv()`."""

    models: tuple[str, ...] = ()  # none: the built-in default model (or the models file's)
    models_file: Annotated[str, declare(bounds.MODELS_FILE, _MODELS_FILE_HELP, shown="none")] | None = None
    revision: (
        Annotated[str, declare(bounds.REVISION, _REVISION_HELP, shown="the repository's default branch")] | None
    ) = None
    served_model_name: (
        Annotated[str, declare(bounds.SERVED_MODEL_NAME, _SERVED_NAME_HELP, shown="the folder's or repository's name")]
        | None
    ) = None
    offline: Annotated[bool, declare(bounds.OFFLINE, _OFFLINE_HELP)] = bounds.OFFLINE.default
    cache_dir: (
        Annotated[
            str, declare(bounds.CACHE_DIR, _CACHE_DIR_HELP, shown="huggingface_hub's: $HF_HUB_CACHE, else $HF_HOME/hub")
        ]
        | None
    ) = None
    load_attempts: Annotated[int, declare(bounds.LOAD_ATTEMPTS, _LOAD_ATTEMPTS_HELP)] = bounds.LOAD_ATTEMPTS.default
    load_retry_seconds: Annotated[float, declare(bounds.LOAD_RETRY_SECONDS, _LOAD_RETRY_HELP)] = (
        bounds.LOAD_RETRY_SECONDS.default
    )
    tenant_policies: (
        Annotated[str, declare(bounds.TENANT_POLICIES, _TENANT_POLICIES_HELP, shown="every tenant the default policy")]
        | None
    ) = None
    device: Annotated[
        str, declare(bounds.DEVICE, "where the models run; auto: the first GPU with room, else the CPU")
    ] = bounds.DEVICE.default
    host: Annotated[str, declare(bounds.HOST, "the address to listen on")] = bounds.HOST.default
    port: Annotated[int, declare(bounds.PORT, "the TCP port to listen on")] = bounds.PORT.default
    uds: Annotated[str, declare(bounds.UDS, "serve on this Unix socket instead of TCP", shown="TCP")] | None = None
    max_request_bytes: Annotated[
        int, declare(bounds.MAX_REQUEST_BYTES, "the largest request body accepted, in bytes", shown="8 MiB")
    ] = bounds.MAX_REQUEST_BYTES.default
    threads: (
        Annotated[
            int,
            declare(
                bounds.THREADS,
                "CPU threads for forwards; at most the CPU budget",
                shown="the whole CPU budget (affinity and cgroup quota), at least 1",
            ),
        ]
        | None
    ) = None
    concurrent_forwards: (
        Annotated[
            int,
            declare(
                bounds.CONCURRENT_FORWARDS,
                _CONCURRENT_HELP,
                shown="2 when the forward threads split evenly in two, else 1; 1 with adaptive threads",
            ),
        ]
        | None
    ) = None
    log_level: Annotated[LogLevel, declare(bounds.LOG_LEVEL, "the least severe log records written")] = (
        bounds.LOG_LEVEL.default
    )
    deterministic: Annotated[bool, declare(bounds.DETERMINISTIC, _DETERMINISTIC_HELP)] = bounds.DETERMINISTIC.default
    max_bundle_tasks: Annotated[
        int, declare(bounds.MAX_BUNDLE_TASKS, "most tasks one /v1/bundle request may hold; more: 413")
    ] = bounds.MAX_BUNDLE_TASKS.default
    # connection hygiene, the same flags as `vllm-sr serve` (docs/hardening.md)
    header_timeout: Annotated[float, declare(bounds.HEADER_TIMEOUT, _HEAD_HELP)] = bounds.HEADER_TIMEOUT.default
    keep_alive_timeout: Annotated[
        float, declare(bounds.KEEP_ALIVE_TIMEOUT, "seconds an idle keep-alive connection stays open")
    ] = bounds.KEEP_ALIVE_TIMEOUT.default
    body_timeout: Annotated[float, declare(bounds.BODY_TIMEOUT, _BODY_HELP)] = bounds.BODY_TIMEOUT.default
    max_header_bytes: Annotated[
        int,
        declare(
            bounds.MAX_HEADER_BYTES,
            "the largest request head (request line and headers), in bytes; 431 past it",
            shown="64 KiB",
        ),
    ] = bounds.MAX_HEADER_BYTES.default
    max_connections: Annotated[
        int,
        declare(
            bounds.MAX_CONNECTIONS,
            "most open client connections; past it the longest-idle one is closed, else the new one gets 503",
        ),
    ] = bounds.MAX_CONNECTIONS.default

    @property
    def engine_name(self) -> str:
        """`--engine`: a plugin's name, or auto."""
        return self.engine or bounds.ENGINE.default

    @property
    def hub_cache(self) -> Path | None:
        """`--cache-dir` as a path (None: huggingface_hub's own cache)."""
        return Path(self.cache_dir).expanduser() if self.cache_dir else None

    @property
    def result_cache_size(self) -> int:
        """`--result-cache-entries`, else its default."""
        return _or(self.result_cache_entries, bounds.RESULT_CACHE_ENTRIES.default)

    @property
    def connections(self) -> ConnectionLimits:
        """The domain's connection limits (docs/hardening.md)."""
        return connection_limits(self)

    def problems(self) -> list[str]:
        """One line per value the worker would refuse (R-ARG-2); [] when it may start."""
        named = [
            f"model {model!r}: a model is named by a non-empty string that does not start with '-'"
            for model in self.models
            if model == "" or model.startswith("-")
        ]
        both = ["--models FILE is refused together with MODEL arguments"] if self.models and self.models_file else []
        return named + both + self._one_model_problems() + super().problems()

    def _one_model_problems(self) -> list[str]:
        """`--revision` and `--served-model-name` name one MODEL argument (a models file entry
        says its own `revision` and `name`)."""
        problems = []
        for flag, value, entry_field in (
            (bounds.REVISION.flag, self.revision, "revision"),
            (bounds.SERVED_MODEL_NAME.flag, self.served_model_name, "name"),
        ):
            if value is None:
                continue
            if self.models_file is not None:
                problems.append(
                    f"{flag} applies to one MODEL argument; with --models FILE each entry sets its {entry_field}"
                )
            elif len(self.models) > 1:
                problems.append(f"{flag} applies to one MODEL argument ({len(self.models)} given)")
        if self.revision is not None and not self.models and self.models_file is None:
            problems.append(f"{bounds.REVISION.flag} applies to a Hugging Face id MODEL (ORG/NAME); none is given")
        return problems

    def to_argv(self) -> list[str]:
        """The `vllm-srun` arguments (after the program name): `serve MODEL… --flag=value…`, only
        the values that differ from the record's defaults."""
        argv = ["serve", *self.models]
        for d in declared(WorkerSettings):
            value = getattr(self, d.name)
            if _same(value, d.default):
                continue
            if isinstance(d.setting, bounds.SwitchSetting):
                argv.append(d.flag if value else d.setting.off_flag)
            else:
                argv.append(f"{d.flag}={_spell(value)}")
        return argv

    def model_specs(self, artifacts: tuple[str, ...]) -> list[ModelSpec]:
        """The flags' models (ARTIFACTS), each with the flags' per-model settings: a Hub id's
        revision (`ORG/NAME@REV`, else `--revision`) held apart from its `ORG/NAME`, and the
        served name `--served-model-name` gives. ModelNotFound (one line): a Hub id that names
        a revision other than `--revision`'s, or `--revision` for a MODEL that is no Hub id."""
        specs = []
        for artifact in artifacts:
            repo, revision = split_revision(artifact, self.revision)
            specs.append(model_spec(repo, self, name=self.served_model_name, revision=revision))
        return specs


def split_revision(artifact: str, revision: str | None = None) -> tuple[str, str | None]:
    """(artifact, revision) of a model argument: a Hub id `ORG/NAME@REV` as (`ORG/NAME`, REV);
    REVISION (`--revision`, or a models file entry's) applies to a Hub id that names none. A path
    that exists is never a Hub id. ModelNotFound (one line): two different revisions, or a
    revision for what is no Hub id."""
    exists = Path(artifact).expanduser().exists()
    ref = None if exists else parse_hub_id(artifact, revision)
    if ref is not None:
        return ref.repo, ref.revision
    if revision is not None:
        raise ModelNotFound(
            f"--revision {revision}: {artifact} is not a Hugging Face id (ORG/NAME); a local folder, "
            "a store or built-in name has no Hub revision"
        )
    return artifact, None


def model_spec(
    artifact: str, args: ModelArgs, *, name: str | None = None, device: str | None = None, **more: Any
) -> ModelSpec:
    """The domain's spec of one served model: ARGS converted to its value types (its family and
    memory budget included); MORE: the models file's other fields (`ModelSpec`: revision, options)."""
    return ModelSpec(
        artifact,
        args.engine_args(),
        name=name,
        device=device,
        admission=args.admission(),
        engine=args.engine,
        family=args.family,
        memory_budget_gib=args.memory_budget_gib,
        **{key: value for key, value in more.items() if value is not None},
    )


# the domain's value types, field by field: their names are the settings' names
_ENGINE_ARGS = EngineArgs()  # the domain's defaults
CONNECTION_SETTINGS = tuple(setting for setting, _ in ConnectionLimits().valued())
_CONNECTION_FIELDS = {
    setting.name: field.name
    for (setting, _), field in zip(ConnectionLimits().valued(), dataclasses.fields(ConnectionLimits))
}


def connection_limits(record: Any) -> ConnectionLimits:
    """The connection flags of either CLI (a record or a parsed namespace) as the domain's limits."""
    return ConnectionLimits(**{field: getattr(record, name) for name, field in _CONNECTION_FIELDS.items()})


def _same(value: object, default: object) -> bool:
    """Equal and of the same kind (`False` is not `0`, `None` only None)."""
    if value is None or default is None:
        return value is default
    return isinstance(value, bool) == isinstance(default, bool) and value == default


def _spell(value: object) -> str:
    """A value as its flag text; floats keep every digit, whole ones drop `.0`."""
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    return str(value)


T = TypeVar("T")


def _or(value: T | None, default: T) -> T:
    return default if value is None else value
