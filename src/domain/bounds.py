"""Every bound and default of the serving settings, stated once (R-ARG, R-ARG-2).

Both CLIs (`vllm-srun serve`, `vllm-sr serve`), the config schema, `EngineArgs.problems()`,
the dtype rules and the front's worker commands take their ranges, choices, defaults and help
texts from here. A setting is named as in the config (`max_num_seqs`); its flag is the same
name with dashes (`--max-num-seqs`).

Pure: strings and numbers in, values or one-line problems out.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class Setting(Generic[T]):
    """One setting: its name, a one-line help text and its default. `shown` says the default in
    words where its value does not (None: worked out at run time, `by device class`)."""

    name: str
    help: str
    default: T
    shown: str = ""

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def default_text(self) -> str:
        """The default as `--help` shows it."""
        return self.shown or _spell(self.default)

    def help_text(self) -> str:
        """What the setting does and its default, for argparse."""
        return f"{self.help} (default: {self.default_text()})"

    def rule(self) -> str:
        """What a value must be: `>= 1`, `between 0 and 10000`, `one of a, b`."""
        raise NotImplementedError

    def accepts(self, value: object) -> bool:
        raise NotImplementedError

    def parse(self, text: str) -> Any:
        """A flag's text as a value; raises ValueError with a one-line reason."""
        raise NotImplementedError

    def problem(self, value: object) -> str | None:
        """`NAME must be RULE (got VALUE)`, or None when the value is allowed (None: unset)."""
        if value is None or self.accepts(value):
            return None
        return f"{self.name} must be {self.rule()} (got {value!r})"


@dataclass(frozen=True, slots=True, kw_only=True)
class IntSetting(Setting[T]):
    """An integer in [low, high]; either end may be open (None)."""

    low: int | None = None
    high: int | None = None

    def rule(self) -> str:
        return _range_rule(self.low, self.high)

    def accepts(self, value: object) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and _within(value, self.low, self.high)

    def parse(self, text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"expected an integer {self.rule()}, got {text!r}") from None
        if not _within(value, self.low, self.high):
            raise ValueError(f"expected an integer {self.rule()}, got {value}")
        return value


@dataclass(frozen=True, slots=True, kw_only=True)
class FloatSetting(Setting[T]):
    """A finite number in [low, high]."""

    low: float
    high: float

    def rule(self) -> str:
        return _range_rule(self.low, self.high)

    def accepts(self, value: object) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and self.low <= value <= self.high

    def parse(self, text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"expected a number {self.rule()}, got {text!r}") from None
        if not self.low <= value <= self.high:  # nan fails both comparisons
            raise ValueError(f"expected a number {self.rule()}, got {_spell(value)}")
        return value


@dataclass(frozen=True, slots=True, kw_only=True)
class ChoiceSetting(Setting[T]):
    """One of a fixed list of names."""

    choices: tuple[str, ...]

    def rule(self) -> str:
        return "one of " + ", ".join(self.choices)

    def accepts(self, value: object) -> bool:
        return value in self.choices

    def parse(self, text: str) -> str:
        if text not in self.choices:
            raise ValueError(f"expected {self.rule()}, got {text!r}")
        return text


@dataclass(frozen=True, slots=True, kw_only=True)
class PatternSetting(Setting[T]):
    """A name spelled by a regular expression (matched in full); `spelled` says it in words."""

    pattern: str
    spelled: str

    def rule(self) -> str:
        return self.spelled

    def accepts(self, value: object) -> bool:
        return isinstance(value, str) and re.fullmatch(self.pattern, value) is not None

    def parse(self, text: str) -> str:
        if not self.accepts(text):
            raise ValueError(f"expected {self.rule()}, got {text!r}")
        return text


@dataclass(frozen=True, slots=True, kw_only=True)
class SwitchSetting(Setting[T]):
    """On or off (`--x` / `--no-x`); None leaves the choice to the model's family."""

    def rule(self) -> str:
        return "true or false"

    def accepts(self, value: object) -> bool:
        return isinstance(value, bool)

    @property
    def off_flag(self) -> str:
        return "--no-" + self.flag[2:]


@dataclass(frozen=True, slots=True, kw_only=True)
class TextSetting(Setting[T]):
    """Free text (a host name, a socket path)."""

    def rule(self) -> str:
        return "a string"

    def accepts(self, value: object) -> bool:
        return isinstance(value, str)

    def parse(self, text: str) -> str:
        return text


# ---- engine arguments (R-ARG) ------------------------------------------------------------------
MAX_NUM_SEQS: IntSetting[int | None] = IntSetting(
    name="max_num_seqs",
    low=1,
    default=None,
    shown="by device class",
    help="most rows in one forward; 1 runs every row alone",
)
MAX_NUM_BATCHED_TOKENS: IntSetting[int | None] = IntSetting(
    name="max_num_batched_tokens",
    low=8,
    default=None,
    shown="by device class",
    help="most counted tokens in one forward",
)
BATCH_WINDOW_MS = FloatSetting(
    name="batch_window_ms",
    low=0.0,
    high=10_000.0,
    default=2.0,
    help="milliseconds the first queued row waits for company",
)
DTYPE = ChoiceSetting(
    name="dtype",
    choices=("auto", "float32", "bfloat16", "float16"),
    default="auto",
    help="the precision the model computes in; auto: the package's, FP32 for a BF16 model on a CPU",
)
ENABLE_SHARED_CONTEXT: SwitchSetting[bool | None] = SwitchSetting(
    name="enable_shared_context",
    default=None,
    shown="on for decision models",
    help="decision models: run a multi-question request's state once",
)
MAX_MODEL_LEN: IntSetting[int | None] = IntSetting(
    name="max_model_len",
    low=1,
    default=None,
    shown="the package's limit",
    help="decision models: most input tokens one question's prompt may have",
)

# ---- the worker process ------------------------------------------------------------------------
RESULT_CACHE_BYTES = 64 * MIB  # the most answer bytes one result cache keeps
_REQUEST_MIB = 8
RESULT_CACHE_ENTRIES = IntSetting(
    name="result_cache_entries",
    low=0,
    default=1024,
    help=f"answers kept in the LRU result cache, at most {RESULT_CACHE_BYTES // MIB} MiB of them; 0 turns it off",
)
MEDIA_WORKERS: IntSetting[int | None] = IntSetting(
    name="media_workers",
    low=0,
    high=64,
    default=None,
    shown="one per 16 CPUs of the budget, 1 to 4",
    help="processes that decode and resize images and videos (R-MEDIA); 0 decodes in the request path",
)
MAX_REQUEST_BYTES = IntSetting(
    name="max_request_bytes",
    low=1,
    default=_REQUEST_MIB * MIB,
    shown=f"{_REQUEST_MIB} MiB",
    help="the largest request body accepted, in bytes",
)
THREADS: IntSetting[int | None] = IntSetting(
    name="threads",
    low=1,
    default=None,
    shown="the whole CPU budget (affinity and cgroup quota), at least 1",
    help="CPU threads for forwards; at most the CPU budget",
)
CONCURRENT_FORWARDS: IntSetting[int | None] = IntSetting(
    name="concurrent_forwards",
    low=1,
    high=64,
    default=None,
    shown="2 when the forward threads split evenly in two, else 1; 1 with adaptive threads",
    help="forwards a CPU worker runs side by side, each on its own team of threads ÷ N "
    "(N divides the thread count; 1 with adaptive threads; a GPU runs one at a time)",
)
DETERMINISTIC = SwitchSetting(
    name="deterministic",
    default=False,
    help="answer every input bit-identically whatever its batch, the load, the cache or the thread count; "
    "refused where the engine cannot honour it",
)
# an environment variable of the worker, not a flag: `VLLM_SRUN_CPU_ADAPTIVE_THREADS` (R-CPU-2)
CPU_ADAPTIVE_THREADS = ChoiceSetting(
    name="cpu_adaptive_threads",
    choices=("0", "1", "2"),
    default="0",
    help="0: off; 1: learn each forward size's fastest thread count from shadow forwards and report it; "
    "2: also serve the learned counts once their shadows matched",
)
DEVICE = PatternSetting(
    name="device",
    pattern=r"cpu|auto|mps|(cuda|rocm)(:[0-9]+)?",
    default="cpu",
    spelled="one of cpu, auto, mps, cuda[:N], rocm[:N]",
    help="where the models run; auto: the first GPU with room, else the CPU",
)
# A deployment's replica names its GPU by index (`cuda:0`), so workers never share one by accident.
REPLICA_DEVICE = PatternSetting(
    name="device",
    pattern=r"cpu|mps|auto|cuda:[0-9]+|rocm:[0-9]+",
    default="auto",
    spelled="one of cpu, cuda:N, rocm:N, mps, auto",
    help="where a managed worker runs",
)
# Engines are plugins (entry point group `vllm_srun.engines`): here only how a name is spelled;
# whether one is installed is the engine registry's to say (`adapters/engines/registry.py`).
ENGINE = PatternSetting(
    name="engine",
    pattern=r"[A-Za-z0-9_][A-Za-z0-9._-]*",
    default="auto",
    spelled="auto or an installed engine's name (letters, digits, '.', '_' or '-')",
    help="the runtime engine",
)
LOG_LEVEL = ChoiceSetting(
    name="log_level",
    choices=("debug", "info", "warning", "error"),
    default="info",
    help="the least severe log records written",
)
HOST = TextSetting(name="host", default="127.0.0.1", help="the address to listen on")
PORT = IntSetting(name="port", low=0, high=65535, default=8100, help="the TCP port to listen on")
FRONT_PORT = dataclasses.replace(PORT, default=8000, help="the TCP port to listen on; workers use Unix sockets")
UDS: TextSetting[str | None] = TextSetting(
    name="uds",
    default=None,
    shown="TCP",
    help="serve on this Unix socket instead of TCP",
)

# ---- admission and bundles (R-ADM-1, R-PERF-1) -------------------------------------------------------
MAX_QUEUE = IntSetting(
    name="max_queue",
    low=1,
    default=64,
    help="unanswered requests one model may hold; past it: 429 overloaded with Retry-After",
)
MAX_QUEUED_TOKENS = IntSetting(
    name="max_queued_tokens",
    low=1,
    default=65_536,
    help="tokens of the unanswered requests one model may hold, counted as request-body bytes "
    "(an upper bound); applies only while a request is pending",
)
MAX_BUNDLE_TASKS = IntSetting(
    name="max_bundle_tasks",
    low=1,
    high=1024,
    default=64,
    help="most tasks one /v1/bundle request may hold; more: 413",
)
MODELS_FILE: TextSetting[str | None] = TextSetting(
    name="models",
    default=None,
    shown="none",
    help="a YAML file of the models to serve, each with its own served name, device and engine "
    "arguments (refused together with MODEL arguments)",
)
MAX_REQUEST_TOKENS = IntSetting(
    name="max_request_tokens",
    low=1,
    default=524_288,
    shown="524288 (2,048 inputs of 256 tokens)",
    help="most tokens the rows of one request may hold (inputs, windows or questions together); 413 past it",
)

# ---- connections (the worker and the front alike; docs/hardening.md) -----------------------------
KIB = 1024
HEADER_TIMEOUT = FloatSetting(
    name="header_timeout",
    low=0.1,
    high=3600.0,
    default=10.0,
    help="seconds a request head may take to arrive, from the connection's opening or the request's first byte",
)
KEEP_ALIVE_TIMEOUT = FloatSetting(
    name="keep_alive_timeout",
    low=0.1,
    high=3600.0,
    default=30.0,
    help="seconds an idle keep-alive connection stays open",
)
BODY_TIMEOUT = FloatSetting(
    name="body_timeout",
    low=0.1,
    high=3600.0,
    default=60.0,
    help="seconds a request body may take to arrive (408 past it), and a response may wait for the client to read it",
)
MAX_HEADER_BYTES = IntSetting(
    name="max_header_bytes",
    low=1 * KIB,
    high=16 * MIB,
    default=64 * KIB,
    shown="64 KiB",
    help="the largest request head (request line and headers), in bytes; 431 past it",
)
MAX_CONNECTIONS = IntSetting(
    name="max_connections",
    low=1,
    high=1_000_000,
    default=2048,
    help="most open client connections; past it the longest-idle one is closed, else the new one gets 503",
)

# ---- the front -------------------------------------------------------------------------------------
TIMEOUT_MS = IntSetting(
    name="timeout_ms",
    low=1,
    default=60_000,
    help="the default deployment's request timeout, in milliseconds",
)
PID_FILE: TextSetting[str | None] = TextSetting(
    name="pid_file",
    default=None,
    shown="$XDG_RUNTIME_DIR/vllm-sr/PORT.json, else <tmp>/vllm-sr-UID/PORT.json",
    help="the file that names the front's pid, host and port, for `vllm-sr reload`",
)
RELOAD_TIMEOUT_S = FloatSetting(
    name="timeout",
    low=1.0,
    high=86_400.0,
    default=600.0,
    help="seconds `vllm-sr reload` waits for the reload's outcome",
)


def problems(checks: Iterable[tuple[Setting[Any], object]]) -> list[str]:
    """One line per value its setting refuses (R-ARG-2), in the order given."""
    return [line for setting, value in checks if (line := setting.problem(value)) is not None]


def _within(value: float, low: float | None, high: float | None) -> bool:
    return (low is None or value >= low) and (high is None or value <= high)


def _range_rule(low: float | None, high: float | None) -> str:
    if low is not None and high is not None:
        return f"between {_spell(low)} and {_spell(high)}"
    if low is not None:
        return f">= {_spell(low)}"
    if high is not None:
        return f"<= {_spell(high)}"
    return "any value"


def _spell(value: object) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
