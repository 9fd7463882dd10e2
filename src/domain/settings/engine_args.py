"""Engine arguments (R-ARG) and how unset batch limits are resolved (R-DEV-1) and calibrated (R-DEV-2).

Their bounds and defaults are those of `bounds.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from vllm_srun.domain.scheduling.planning import Budget
from vllm_srun.domain.settings import bounds
from vllm_srun.domain.settings.devices import class_limits


@dataclass(frozen=True, slots=True)
class EngineArgs:
    max_num_seqs: int | None = bounds.MAX_NUM_SEQS.default
    max_num_batched_tokens: int | None = bounds.MAX_NUM_BATCHED_TOKENS.default
    batch_window_ms: float = bounds.BATCH_WINDOW_MS.default
    dtype: str = bounds.DTYPE.default
    enable_shared_context: bool | None = bounds.ENABLE_SHARED_CONTEXT.default  # None: the family's
    max_model_len: int | None = bounds.MAX_MODEL_LEN.default
    input_max_tokens: int | None = bounds.INPUT_MAX_TOKENS.default  # None: the model's own limit
    input_overflow: str = bounds.INPUT_OVERFLOW.default  # a request's overflow when it sets none
    profile: str | None = bounds.PROFILE.default  # R-PROF-3: None: unset (exact unless another setting asks more)

    def problems(self) -> list[str]:
        """One line per out-of-range value (R-ARG-2)."""
        return bounds.problems(
            [
                (bounds.MAX_NUM_SEQS, self.max_num_seqs),
                (bounds.MAX_NUM_BATCHED_TOKENS, self.max_num_batched_tokens),
                (bounds.BATCH_WINDOW_MS, self.batch_window_ms),
                (bounds.DTYPE, self.dtype),
                (bounds.ENABLE_SHARED_CONTEXT, self.enable_shared_context),
                (bounds.MAX_MODEL_LEN, self.max_model_len),
                (bounds.INPUT_MAX_TOKENS, self.input_max_tokens),
                (bounds.INPUT_OVERFLOW, self.input_overflow),
                (bounds.PROFILE, self.profile),
            ]
        )


@dataclass(frozen=True, slots=True)
class BatchingLimits:
    max_num_seqs: int
    max_num_batched_tokens: int
    seqs_source: str  # set | class
    tokens_source: str  # set | class | calibrated
    memory_class: str

    @property
    def budget(self) -> Budget:
        """The limits as the planner holds them (the forward budget)."""
        return Budget(self.max_num_seqs, self.max_num_batched_tokens)


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


def calibrated_limits(limits: BatchingLimits, tokens: int) -> BatchingLimits:
    """LIMITS with a calibrated token budget (R-DEV-2); a value the user set is never changed."""
    if limits.tokens_source == "set":
        return limits
    return replace(limits, max_num_batched_tokens=tokens, tokens_source="calibrated")
