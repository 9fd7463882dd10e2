"""Engine arguments (R-ARG) and how unset batch limits are resolved (R-DEV-1)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from vllm_srun.domain.devices import class_limits

DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True, slots=True)
class EngineArgs:
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    batch_window_ms: float = 2.0
    dtype: str = "auto"
    enable_shared_context: bool | None = None  # None: the family's default
    max_model_len: int | None = None

    def problems(self) -> list[str]:
        """One line per out-of-range value (R-ARG-2)."""
        out = []
        if self.max_num_seqs is not None and self.max_num_seqs < 1:
            out.append(f"max_num_seqs must be >= 1 (got {self.max_num_seqs})")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 8:
            out.append(f"max_num_batched_tokens must be >= 8 (got {self.max_num_batched_tokens})")
        if not (0 <= self.batch_window_ms <= 10_000):
            out.append(f"batch_window_ms must be between 0 and 10000 (got {self.batch_window_ms})")
        if self.dtype not in DTYPES:
            out.append(f"dtype must be one of {', '.join(DTYPES)} (got {self.dtype!r})")
        if self.max_model_len is not None and self.max_model_len < 1:
            out.append(f"max_model_len must be >= 1 (got {self.max_model_len})")
        return out


@dataclass(frozen=True, slots=True)
class BatchingLimits:
    max_num_seqs: int
    max_num_batched_tokens: int
    seqs_source: str  # set | class
    tokens_source: str  # set | class | calibrated
    memory_class: str


def resolve_limits(args: EngineArgs, device_kind: str, memory_bytes: int | None) -> BatchingLimits:
    limits = class_limits(device_kind, memory_bytes)
    return BatchingLimits(
        max_num_seqs=args.max_num_seqs if args.max_num_seqs is not None else limits.max_num_seqs,
        max_num_batched_tokens=(
            args.max_num_batched_tokens if args.max_num_batched_tokens is not None else limits.max_num_batched_tokens
        ),
        seqs_source="set" if args.max_num_seqs is not None else "class",
        tokens_source="set" if args.max_num_batched_tokens is not None else "class",
        memory_class=limits.memory_class,
    )


def with_overrides(base: EngineArgs, **changes: object) -> EngineArgs:
    return replace(base, **{k: v for k, v in changes.items() if v is not None})
