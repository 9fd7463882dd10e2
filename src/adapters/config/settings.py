"""What one `vllm-srun serve` process is told (R-ARG, R-REP-1, R-CPU-1): the `WorkerSettings`
record, a `ServingArgs` (`model_args.py`) with the worker's own settings, declared once
(`declarations.declare`). The worker CLI parses its argv into one; the front builds one per
managed worker and renders it with `to_argv()`, which the worker reads back into an equal record.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

from vllm_srun.adapters.config.declarations import declare, declared, or_default, same_value
from vllm_srun.adapters.config.domain_values import connection_limits, model_spec, split_revision
from vllm_srun.adapters.config.model_args import ServingArgs
from vllm_srun.domain.security.connections import ConnectionLimits
from vllm_srun.domain.settings import bounds
from vllm_srun.domain.worker.worker_settings import ModelSpec

# msgspec reads a Literal's values at run time: the bounds module's choices, stated once there.
# A type checker cannot read them, so it sees the field as a string.
if TYPE_CHECKING:
    LogLevel = str
else:
    LogLevel = Literal[bounds.LOG_LEVEL.choices]


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
        return or_default(self.result_cache_entries, bounds.RESULT_CACHE_ENTRIES.default)

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
            if same_value(value, d.default):
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


def _spell(value: object) -> str:
    """A value as its flag text; floats keep every digit, whole ones drop `.0`."""
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    return str(value)
