"""Every bound and default of the serving settings, stated once (R-ARG, R-ARG-2).

The settings records (`adapters/config/model_args.py`, `settings.py`) declares each field with its setting here:
both CLIs, the config schema, the models file, `EngineArgs.problems()`, the dtype rules and the
front's worker commands take their ranges, choices and defaults from here. What a setting does
(its help text) is said where it is declared, not here. A setting is named as in the config
(`max_num_seqs`); its flag is the same name with dashes (`--max-num-seqs`).

Pure: strings and numbers in, values or one-line problems out.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from vllm_srun.domain.settings.profiles import NAMES as PROFILE_NAMES

T = TypeVar("T")

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class Setting(Generic[T]):
    """One setting: its name and its default (None: worked out at run time, e.g. by device class)."""

    name: str
    default: T
    spelled_flag: str = ""  # the flag, where it is not the name with dashes (`--memory-budget`)

    @property
    def flag(self) -> str:
        return self.spelled_flag or "--" + self.name.replace("_", "-")

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
            raise ValueError(f"expected a number {self.rule()}, got {spell(value)}")
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
)
MAX_NUM_BATCHED_TOKENS: IntSetting[int | None] = IntSetting(
    name="max_num_batched_tokens",
    low=8,
    default=None,
)
BATCH_WINDOW_MS = FloatSetting(
    name="batch_window_ms",
    low=0.0,
    high=10_000.0,
    default=2.0,
)
DTYPE = ChoiceSetting(
    name="dtype",
    choices=("auto", "float32", "bfloat16", "float16"),
    default="auto",
)
ENABLE_SHARED_CONTEXT: SwitchSetting[bool | None] = SwitchSetting(
    name="enable_shared_context",
    default=None,
)
# R-PROF: the profile a model serves (`domain/settings/profiles.py`); unset: exact, unless another setting
# asks for more (`profiles.serving_profile`)
PROFILE: ChoiceSetting[str | None] = ChoiceSetting(
    name="profile",
    choices=PROFILE_NAMES,
    default=None,
)
# a model whose estimated resident size (its weights at the precision it computes in) exceeds this
# many GiB is refused before its weights are read (upstream's flag `--memory-budget`)
MEMORY_BUDGET_GIB: FloatSetting[float | None] = FloatSetting(
    name="memory_budget_gib",
    spelled_flag="--memory-budget",
    low=1e-6,
    high=1_000_000.0,
    default=None,
)
# the family that must read a model's package (a plugin's name; whether one is installed is the
# family registry's to say); None: detected from the package
FAMILY: PatternSetting[str | None] = PatternSetting(
    name="family",
    pattern=r"[A-Za-z0-9_][A-Za-z0-9._-]*",
    default=None,
    spelled="an installed family's name (letters, digits, '.', '_' or '-')",
)
MAX_MODEL_LEN: IntSetting[int | None] = IntSetting(
    name="max_model_len",
    low=1,
    default=None,
)
# a model's input budget (upstream's deployment `input: {max_tokens, overflow}`): most tokens one
# input may have, and what is done with a longer one when the request does not say
INPUT_MAX_TOKENS: IntSetting[int | None] = IntSetting(
    name="input_max_tokens",
    low=1,
    default=None,
)
INPUT_OVERFLOW = ChoiceSetting(
    name="input_overflow",
    choices=("reject", "truncate", "window"),
    default="reject",
)

# ---- the worker process ------------------------------------------------------------------------
RESULT_CACHE_BYTES = 64 * MIB  # the most answer bytes one result cache keeps
_REQUEST_MIB = 8
RESULT_CACHE_ENTRIES = IntSetting(
    name="result_cache_entries",
    low=0,
    default=1024,
)
MEDIA_WORKERS: IntSetting[int | None] = IntSetting(
    name="media_workers",
    low=0,
    high=64,
    default=None,
)
MAX_REQUEST_BYTES = IntSetting(
    name="max_request_bytes",
    low=1,
    default=_REQUEST_MIB * MIB,
)
THREADS: IntSetting[int | None] = IntSetting(
    name="threads",
    low=1,
    default=None,
)
CONCURRENT_FORWARDS: IntSetting[int | None] = IntSetting(
    name="concurrent_forwards",
    low=1,
    high=64,
    default=None,
)
DETERMINISTIC = SwitchSetting(
    name="deterministic",
    default=False,
)
# an environment variable of the worker, not a flag: `VLLM_SRUN_CPU_ADAPTIVE_THREADS` (R-CPU-2)
CPU_ADAPTIVE_THREADS = ChoiceSetting(
    name="cpu_adaptive_threads",
    choices=("0", "1", "2"),
    default="0",
)
DEVICE = PatternSetting(
    name="device",
    pattern=r"cpu|auto|mps|(cuda|rocm)(:[0-9]+)?",
    default="auto",
    spelled="one of cpu, auto, mps, cuda[:N], rocm[:N]",
)
# A deployment's replica names its GPU by index (`cuda:0`), so workers never share one by accident.
REPLICA_DEVICE = PatternSetting(
    name="device",
    pattern=r"cpu|mps|auto|cuda:[0-9]+|rocm:[0-9]+",
    default="auto",
    spelled="one of cpu, cuda:N, rocm:N, mps, auto",
)
# Engines are plugins (entry point group `vllm_srun.engines`): here only how a name is spelled;
# whether one is installed is the engine registry's to say (`adapters/engines/registry.py`).
ENGINE = PatternSetting(
    name="engine",
    pattern=r"[A-Za-z0-9_][A-Za-z0-9._-]*",
    default="auto",
    spelled="auto or an installed engine's name (letters, digits, '.', '_' or '-')",
)
LOG_LEVEL = ChoiceSetting(
    name="log_level",
    choices=("debug", "info", "warning", "error"),
    default="info",
)
HOST = TextSetting(name="host", default="127.0.0.1")
PORT = IntSetting(name="port", low=0, high=65535, default=8100)
FRONT_PORT = dataclasses.replace(PORT, default=8000)
UDS: TextSetting[str | None] = TextSetting(
    name="uds",
    default=None,
)

# ---- admission and bundles (R-ADM-1, R-PERF-1) -------------------------------------------------------
MAX_QUEUE = IntSetting(
    name="max_queue",
    low=1,
    default=64,
)
MAX_QUEUED_TOKENS = IntSetting(
    name="max_queued_tokens",
    low=1,
    default=65_536,
)
MAX_BUNDLE_TASKS = IntSetting(
    name="max_bundle_tasks",
    low=1,
    high=1024,
    default=64,
)
# ---- naming and finding the models (R-PKG-5) --------------------------------------------------------
# `--revision`: a branch, a tag or a commit of a Hub id MODEL (as `ORG/NAME@REV` spells it)
REVISION: PatternSetting[str | None] = PatternSetting(
    name="revision",
    pattern=r"[A-Za-z0-9][A-Za-z0-9._/-]{0,254}",
    default=None,
    spelled="a branch, a tag or a 40-hex commit of the Hub repository",
)
SERVED_MODEL_NAME: PatternSetting[str | None] = PatternSetting(
    name="served_model_name",
    pattern=r"[^\s-]\S{0,255}",
    default=None,
    spelled="a name of at most 256 characters, without spaces, not starting with '-'",
)
OFFLINE = SwitchSetting(
    name="offline",
    default=False,
)
CACHE_DIR: TextSetting[str | None] = TextSetting(
    name="cache_dir",
    default=None,
)
# R-LOAD-1: loads of a model before a transient failure is final, and the wait before the second
# one (doubling after each failure, at most LOAD_RETRY_CAP_S)
LOAD_ATTEMPTS = IntSetting(
    name="load_attempts",
    low=1,
    high=100,
    default=5,
)
LOAD_RETRY_CAP_S = 300.0
LOAD_RETRY_SECONDS = FloatSetting(
    name="load_retry_seconds",
    low=0.0,
    high=LOAD_RETRY_CAP_S,
    default=5.0,
)
MODELS_FILE: TextSetting[str | None] = TextSetting(
    name="models",
    default=None,
)
TENANT_POLICIES: TextSetting[str | None] = TextSetting(  # a key file, read for its policy columns (R-FAIR-1)
    name="tenant_policies",
    default=None,
)
MAX_REQUEST_TOKENS = IntSetting(
    name="max_request_tokens",
    low=1,
    default=524_288,
)

# ---- connections (the worker and the front alike; docs/hardening.md) -----------------------------
KIB = 1024
HEADER_TIMEOUT = FloatSetting(
    name="header_timeout",
    low=0.1,
    high=3600.0,
    default=10.0,
)
KEEP_ALIVE_TIMEOUT = FloatSetting(
    name="keep_alive_timeout",
    low=0.1,
    high=3600.0,
    default=30.0,
)
BODY_TIMEOUT = FloatSetting(
    name="body_timeout",
    low=0.1,
    high=3600.0,
    default=60.0,
)
MAX_HEADER_BYTES = IntSetting(
    name="max_header_bytes",
    low=1 * KIB,
    high=16 * MIB,
    default=64 * KIB,
)
MAX_CONNECTIONS = IntSetting(
    name="max_connections",
    low=1,
    high=1_000_000,
    default=2048,
)

# ---- the front -------------------------------------------------------------------------------------
TIMEOUT_MS = IntSetting(
    name="timeout_ms",
    low=1,
    default=60_000,
)
PID_FILE: TextSetting[str | None] = TextSetting(
    name="pid_file",
    default=None,
)
RELOAD_TIMEOUT_S = FloatSetting(
    name="timeout",
    low=1.0,
    high=86_400.0,
    default=600.0,
)


def problems(checks: Iterable[tuple[Setting[Any], object]]) -> list[str]:
    """One line per value its setting refuses (R-ARG-2), in the order given."""
    return [line for setting, value in checks if (line := setting.problem(value)) is not None]


def _within(value: float, low: float | None, high: float | None) -> bool:
    return (low is None or value >= low) and (high is None or value <= high)


def _range_rule(low: float | None, high: float | None) -> str:
    if low is not None and high is not None:
        return f"between {spell(low)} and {spell(high)}"
    if low is not None:
        return f">= {spell(low)}"
    if high is not None:
        return f"<= {spell(high)}"
    return "any value"


def spell(value: object) -> str:
    """A value as `--help` and the rules say it: whole floats without `.0`."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
